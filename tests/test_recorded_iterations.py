"""The breakdown of several recorded iterations (attribute/breakdown.py): each operation's time is
its median over iterations that ran the same operations at the same lines, so a slow first
recorded iteration (the recorder's own code running for the first time) or one preempted
operation does not count; iterations that differ keep their mean.

The iterations are recorded for real (torch, the recorder, a project on disk); their operations'
durations are then set here, so that the expected times are exact on any machine.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import torch

from service_client import marked_line
from skyline_engine.attribute.creation import CreationSites
from skyline_engine.attribute.frames import CallSites
from skyline_engine.attribute.recording import MAX_RECORDED_ITERATIONS, IterationRecording
from skyline_engine.entry.loader import load_entry_point
from skyline_engine.measure.iteration import IterationRunner
from skyline_engine.measure.timing import TimingBudget

ENTRY = "entry.py"
SAME_EACH_TIME = """
import torch


def skyline_model_provider():
    return torch.nn.Linear(8, 4)


def skyline_input_provider(batch_size=4):
    return (torch.randn(batch_size, 8),)


def skyline_iteration_provider(model):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    def iteration(x):
        optimizer.zero_grad()
        loss = model(x).sum()  # <- MODEL
        loss.backward()
        optimizer.step()

    return iteration
"""
# Every other iteration runs one operation more: the recorded iterations differ.
ALTERNATING = SAME_EACH_TIME.replace(
    "    def iteration(x):\n",
    "    calls = [0]\n\n    def iteration(x):\n        calls[0] += 1\n        if calls[0] % 2:\n"
    "            x = x * 1.0  # <- SOMETIMES\n",
)
NO_SCALING = 1e9  # a measured iteration far longer than the operations: their times are kept


def three_recorded(project: Path, source: str):
    """Three recorded iterations of `source` (as an analysis records a fast model), broken down
    after `set_durations(iterations)` has set each one's operations' times."""
    (project / ENTRY).write_text(textwrap.dedent(source), encoding="utf-8")
    entry = load_entry_point(project / ENTRY, project)
    device = torch.device("cpu")
    creation = CreationSites(CallSites(entry.files))
    with creation.recording_modules():
        runner = IterationRunner(entry, device, TimingBudget())
    with runner, runner.at_batch_size(4) as run:
        recording = IterationRecording(creation, runner.model, device)
        memory, _ = recording.record_first(run, runner.clock, runner.live_tensors)
        recording.record_more(run, run_time_ms=1.0)  # two more: MAX_RECORDED_ITERATIONS in all
    operations = recording.recorder.recording.operations
    starts = recording.recorder.recording.iteration_starts
    assert len(starts) == MAX_RECORDED_ITERATIONS == 3
    iterations = [operations[a:b] for a, b in zip(starts, [*starts[1:], len(operations)])]

    def broken_down(durations_of_iteration):
        for index, ops in enumerate(iterations):
            for op in ops:
                op.duration_ms = durations_of_iteration(index, op)
        return recording.breakdown(NO_SCALING, memory.peak_bytes)

    return iterations, broken_down


def test_each_operation_takes_its_median_time_when_the_iterations_ran_the_same_operations(tmp_path):
    iterations, broken_down = three_recorded(tmp_path, SAME_EACH_TIME)
    per_iteration = len(iterations[0])
    assert [len(ops) for ops in iterations] == [per_iteration] * 3
    # The first recorded iteration slow throughout (5 ms an operation), the others 1 and 2 ms.
    breakdown = broken_down(lambda index, op: (5.0, 1.0, 2.0)[index])
    assert breakdown.attribution.operations_ms == pytest.approx(2.0 * per_iteration)  # the mean: 8/3 each
    model_line = marked_line(tmp_path / ENTRY, "# <- MODEL")
    (line,) = [entry for entry in breakdown.lines if entry.line == model_line]
    at_line = [op for op in iterations[0] if op.stack and op.stack[0][1] == model_line]
    forward = sum(1 for op in at_line if op.phase == "forward")
    backward = sum(1 for op in at_line if op.phase == "backward")
    assert forward and backward
    assert (line.forward_ms, line.backward_ms) == (pytest.approx(2.0 * forward), pytest.approx(2.0 * backward))


def test_an_operation_slow_in_one_iteration_alone_keeps_its_usual_time(tmp_path):
    iterations, broken_down = three_recorded(tmp_path, SAME_EACH_TIME)
    preempted = iterations[2][0]
    breakdown = broken_down(lambda index, op: 100.0 if op is preempted else 1.0)
    assert breakdown.attribution.operations_ms == pytest.approx(1.0 * len(iterations[0]))


def test_iterations_that_ran_different_operations_keep_their_mean(tmp_path):
    iterations, broken_down = three_recorded(tmp_path, ALTERNATING)
    sometimes = marked_line(tmp_path / ENTRY, "# <- SOMETIMES")
    assert [any(op.stack and op.stack[0][1] == sometimes for op in ops) for ops in iterations] == [True, False, True]
    breakdown = broken_down(lambda index, op: (5.0, 1.0, 2.0)[index])
    total = sum(duration * len(ops) for duration, ops in zip((5.0, 1.0, 2.0), iterations))
    assert breakdown.attribution.operations_ms == pytest.approx(total / 3)
    (line,) = [entry for entry in breakdown.lines if entry.line == sometimes]
    assert line.forward_ms == pytest.approx((5.0 + 2.0) / 3)  # run twice in three iterations
