"""Attribution when backward runs on another thread than the iteration, as it does on CUDA (its
autograd device thread sees the dispatch mode but none of the user's Python frames)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from engine_helpers import analysed, marked_line
from skyline_engine.attribute.frames import CallSites
from skyline_engine.entry.user_frames import ProjectFiles

ENTRY = """\
import torch
import torch.nn as nn

from threaded_backward import backward_in_a_bare_thread


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.first = nn.Linear(64, 64)
        self.second = nn.Linear(64, 1)

    def forward(self, x):
        h = self.first(x).tanh()  # FIRST
        return self.second(h).square().mean()  # SECOND


def skyline_model_provider():
    return Net()


def skyline_input_provider(batch_size=16):
    return (torch.randn(batch_size, 64),)


def skyline_iteration_provider(model):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def iteration(x):
        optimizer.zero_grad()
        loss = model(x)
        BACKWARD(loss)  # BACKWARD_CALL
        optimizer.step()

    return iteration
"""


def test_the_stack_walk_tolerates_any_depth(tmp_path):
    """A fresh thread's stack is a few frames deep; asking to skip more than that is no error."""
    sites = CallSites(ProjectFiles(tmp_path))
    seen = []
    thread = threading.Thread(target=lambda: seen.append((sites.stack(skip=50), sites.innermost(skip=50))))
    thread.start()
    thread.join()
    assert seen == [(((), None), (None, None))]


def analysed_backward(root: Path, backward: str) -> dict:
    root.mkdir()
    return analysed(root, "entry.py", source=ENTRY.replace("BACKWARD", backward), predict=False)


@pytest.fixture(scope="module")
def documents(tmp_path_factory):
    """The same model with backward on the iteration's thread, and on a thread of its own."""
    base = tmp_path_factory.mktemp("threads")
    return (
        analysed_backward(base / "same", "torch.autograd.backward"),
        analysed_backward(base / "other", "backward_in_a_bare_thread"),
    )


def backward_lines(document: dict) -> dict:
    return {entry["line"]: entry["backward_ms"] for entry in document["lines"] if entry["backward_ms"] > 0}


@pytest.mark.slow
def test_backward_on_another_thread_lands_on_the_same_lines(documents):
    same, other = documents
    expected = {marked_line(ENTRY, "# FIRST"), marked_line(ENTRY, "# SECOND"), marked_line(ENTRY, "# BACKWARD_CALL")}
    assert set(backward_lines(same)) == expected
    assert set(backward_lines(other)) == expected


@pytest.mark.slow
def test_gradient_accumulation_belongs_to_the_line_that_called_backward(documents):
    """AccumulateGrad nodes have no forward operation: their work is read from the stack of the
    thread that called backward, not from the thread that ran it."""
    for document in documents:
        accumulate = [
            node for node in document["operations"]["children"] if node["name"] == "torch::autograd::AccumulateGrad"
        ]
        assert accumulate, "no gradient accumulation was recorded"
        assert all(
            node["contexts"][0] == {"path": "entry.py", "line": marked_line(ENTRY, "# BACKWARD_CALL")}
            for node in accumulate
        )
