"""The memory parts add up (issue "Numbers you can act on", item 6): gradients are counted while
they are alive, also when the iteration frees them at its end; the parts describe the moment of the
peak and sum to it. The real engine on iterations whose tensors are known by construction."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine_helpers import QUICK
from skyline_engine.analysis.session import AnalysisRequest, analyze

pytestmark = pytest.mark.slow  # real analyses

PROJECTS = Path(__file__).parent / "projects"

ZERO_GRAD_LAST = """\
import torch


def skyline_model_provider():
    return torch.nn.Sequential(torch.nn.Linear(16, 256), torch.nn.ReLU(), torch.nn.Linear(256, 64))


def skyline_input_provider(batch_size=8):
    return (torch.randn(batch_size, 16),)


def skyline_iteration_provider(model):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    def iteration(x):
        model(x).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)  # no .grad is left when the iteration ends

    return iteration
"""


def analysed(tmp_path, source: str) -> dict:
    """The document of the entry point `source`, on the CPU without predictions."""
    (tmp_path / "entry_point.py").write_text(source, encoding="utf-8")
    request = AnalysisRequest("entry_point.py", tmp_path, device="cpu", budget=QUICK, predict=False)
    return analyze(request).to_dict()


def test_gradients_freed_at_the_end_of_the_iteration_are_counted(tmp_path):
    # Each parameter's gradient lives through backward and the step, the size of the parameter.
    document = analysed(tmp_path, ZERO_GRAD_LAST)
    weights = {w["name"]: (w["size_bytes"], w["grad_size_bytes"]) for w in document["weights"]}
    assert weights == {
        "model.0.weight": (256 * 16 * 4, 256 * 16 * 4),
        "model.0.bias": (256 * 4, 256 * 4),
        "model.2.weight": (64 * 256 * 4, 64 * 256 * 4),
        "model.2.bias": (64 * 4, 64 * 4),
    }


def parts(document: dict) -> dict[str, int]:
    return document["peak_memory_parts"]


def test_a_peak_in_the_optimizer_step_is_what_is_alive_there(tmp_path):
    # Adam over wide layers: weights, gradients and Adam's two moments dominate, and the step's
    # temporaries on top of them set the peak; backward freed every activation before the step.
    document = analysed(tmp_path, (PROJECTS / "optimizer_dominated" / "entry_point.py").read_text())
    assert document["iteration"]["peak_memory_phase"] == "optimizer"
    at = parts(document)
    assert sum(at.values()) == document["iteration"]["peak_memory_bytes"]
    weights = sum(w["size_bytes"] for w in document["weights"])
    assert at["weights_bytes"] == weights
    assert at["gradients_bytes"] == weights == sum(w["grad_size_bytes"] for w in document["weights"])
    assert at["optimizer_state_bytes"] == sum(s["size_bytes"] for s in document["optimizer_state"]) >= 2 * weights
    assert at["activations_bytes"] == 0 < document["operations"]["activation_bytes"]  # all freed by backward
    # The other tensors hold at least what the step made and still holds there.
    step_made = sum(t["bytes"] for t in document["peak_memory_operation"]["other_tensors"] if t["phase"] == "optimizer")
    assert at["other_bytes"] == document["untracked"]["memory_bytes"] >= step_made > 0


TRANSIENT_PEAK = """\
import torch


def skyline_model_provider():
    return torch.nn.Linear(256, 256)


def skyline_input_provider(batch_size=8):
    return (torch.randn(batch_size, 256),)


def skyline_iteration_provider(model):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    def iteration(x):
        optimizer.zero_grad(set_to_none=SET_TO_NONE)
        with torch.no_grad():
            x = x + x.repeat(1, 256).sum() * 0  # the peak: 2 MiB made and dropped
        model(x).pow(2).mean().backward()
        optimizer.step()

    return iteration
"""


@pytest.mark.parametrize("set_to_none", [True, False])
def test_a_peak_before_backward_holds_the_gradients_zero_grad_left(tmp_path, set_to_none):
    # zero_grad() frees the previous iteration's gradients: none is alive at a peak before
    # backward; zero_grad(set_to_none=False) zeroes them in place: all of them are.
    document = analysed(tmp_path, TRANSIENT_PEAK.replace("SET_TO_NONE", str(set_to_none)))
    assert document["peak_memory_operation"]["phase"] == "forward"
    at = parts(document)
    assert sum(at.values()) == document["iteration"]["peak_memory_bytes"]
    weights = (256 * 256 + 256) * 4
    assert at["weights_bytes"] == weights
    assert at["gradients_bytes"] == (0 if set_to_none else weights)
    assert at["optimizer_state_bytes"] == 0 and at["activations_bytes"] == 0  # plain SGD; before the model ran
    assert at["other_bytes"] >= 8 * 256 * 256 * 4  # the transient
