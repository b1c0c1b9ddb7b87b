"""The other tensors alive at the memory peak, by the line that made them, and the engine's own
hold on them. A classifier's logits are freed once its cross-entropy has run; the engine kept the
model's last output (to check the loss is finite) through backward and into the next iteration,
so every peak it measured held them (a 1 MiB tensor in a 4.3 MiB peak). The real engine on
iterations whose tensors are known by construction: a Linear to 4,096 classes, 64 samples, so the
logits and each gradient flowing back through the cross-entropy are 1 MiB of float32."""

from __future__ import annotations

import json

import pytest

from conftest import run_skyline
from engine_helpers import analysed, marked_line

pytestmark = pytest.mark.slow  # analyses and the CLI

LOGITS_BYTES = 64 * 4096 * 4

HEAD = """\
import torch
import torch.nn.functional as F


def skyline_model_provider():
    return torch.nn.Linear(16, 4096)


def skyline_input_provider(batch_size=64):
    return torch.randn(batch_size, 16), torch.randint(0, 4096, (batch_size,))


def skyline_iteration_provider(model):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    def iteration(x, y):
        optimizer.zero_grad()
"""
TAIL = """\
        loss.backward()
        optimizer.step()

    return iteration
"""
# The logits dropped as soon as the loss is computed, or held by a name to the end of the iteration.
DROPPED = "        loss = F.cross_entropy(model(x), y)  # LOSS\n"
HELD = "        logits = model(x)  # LOGITS\n        loss = F.cross_entropy(logits, y)  # LOSS\n"


def analysed_classifier(tmp_path, body: str, name: str) -> tuple[dict, dict[str, int]]:
    """The document of the classifier's iteration with `body`, written as `name`, without
    predictions; and the lines its markers are at."""
    source = HEAD + body + TAIL
    document = analysed(tmp_path, name, source=source, predict=False)
    return document, {mark: marked_line(source, f"# {mark}") for mark in ("LOSS", "LOGITS") if f"# {mark}" in body}


def test_the_engine_holds_no_output_holding_the_logits_costs_exactly_their_bytes(tmp_path):
    # Each in a process of its own, as a user runs it: a peak counts every tensor alive in the
    # process, and tensors other tests left behind come and go (1.5 MiB of torch.compile's).
    peaks = []
    for body, name in ((HELD, "held.py"), (DROPPED, "dropped.py")):
        (tmp_path / name).write_text(HEAD + body + TAIL, encoding="utf-8")
        out = tmp_path / f"{name}.json"
        result = run_skyline("profile", name, "--device", "cpu", "--json", out, cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        peaks.append(json.loads(out.read_text())["iteration"]["peak_memory_bytes"])
    assert peaks[0] - peaks[1] == LOGITS_BYTES


def other_tensors(document: dict) -> dict[tuple[int, str], int]:
    return {(t["line"], t["phase"]): t["bytes"] for t in document["peak_memory_operation"]["other_tensors"]}


def test_the_gradients_flowing_back_are_named_at_the_loss_line(tmp_path):
    document, lines = analysed_classifier(tmp_path, DROPPED, "dropped.py")
    peak = document["peak_memory_operation"]
    assert (peak["line"], peak["phase"]) == (lines["LOSS"], "backward")  # the cross-entropy's backward
    at_peak = other_tensors(document)
    # The gradient of the log-probabilities and the one flowing on to the logits, both alive.
    assert at_peak[(lines["LOSS"], "backward")] == 2 * LOGITS_BYTES
    # Nothing of the forward pass but the loss itself: the logits were freed.
    assert at_peak.get((lines["LOSS"], "forward"), 0) < 1024
    # With the weights (their gradients are not made yet), the inputs and the log-probabilities
    # saved for the backward running, they are within the peak: none counted twice. The rest is
    # what the test process held before (other tests' tensors).
    weights = sum(w["size_bytes"] for w in document["weights"])
    inputs = 64 * 16 * 4 + 64 * 8  # the features, float32, and the classes, int64
    saved = LOGITS_BYTES
    rest = document["iteration"]["peak_memory_bytes"] - (weights + inputs + saved + sum(at_peak.values()))
    assert rest >= 0


def test_logits_the_code_holds_are_named_at_their_line(tmp_path):
    document, lines = analysed_classifier(tmp_path, HELD, "held.py")
    assert other_tensors(document)[(lines["LOGITS"], "forward")] == LOGITS_BYTES


ADAM = """\
import torch


def skyline_model_provider():
    return torch.nn.Sequential(torch.nn.Linear(16, 256), torch.nn.Linear(256, 4096))


def skyline_input_provider(batch_size=8):
    return (torch.randn(batch_size, 16),)


def skyline_iteration_provider(model):
    optimizer = torch.optim.Adam(model.parameters(), foreach=False)

    def iteration(x):
        optimizer.zero_grad()  # the gradients are freed: backward makes them anew
        model(x).pow(2).mean().backward()
        optimizer.step()  # STEP

    return iteration
"""


def test_a_step_s_temporaries_are_named_at_the_step_and_gradients_are_not(tmp_path):
    # Single-tensor Adam makes weight-sized temporaries on top of weights, gradients and its
    # state, where backward makes one (the wide layer's weight gradient, which becomes its .grad)
    # and the activations are a thousandth of them.
    document = analysed(tmp_path, "adam.py", source=ADAM, predict=False)
    step = marked_line(ADAM, "# STEP")
    peak = document["peak_memory_operation"]
    assert (peak["line"], peak["phase"]) == (step, "optimizer")
    at_peak = other_tensors(document)
    assert at_peak[(step, "optimizer")] >= 256 * 4096 * 4  # at least one temporary the wide weight's size
    assert not any(phase == "backward" for _, phase in at_peak)


FREED = """\
import torch


def skyline_model_provider():
    return torch.nn.Linear(16, 16)


def skyline_input_provider(batch_size=8):
    return (torch.randn(batch_size, 16),)


def skyline_iteration_provider(model):
    def iteration(x):
        with torch.no_grad():
            a = x.repeat(1, 1024)  # A
            b = a * 2  # B
            del a
            c = b.repeat(1, 2)  # C
            del b, c
        model(x).pow(2).mean().backward()

    return iteration
"""


def test_a_tensor_freed_just_before_the_peak_s_operation_is_not_there(tmp_path):
    # Without gradients: a and b (512 KiB each), then a freed, then c (1 MiB): the peak is c's
    # operation, where b and c are alive and a no longer is.
    document = analysed(tmp_path, "freed.py", source=FREED, predict=False)
    b, c = (marked_line(FREED, f"# {mark}") for mark in "BC")
    assert document["peak_memory_operation"]["line"] == c
    unit = 8 * 16 * 1024 * 4
    assert other_tensors(document) == {(b, "forward"): unit, (c, "forward"): 2 * unit}  # none at line `a`
