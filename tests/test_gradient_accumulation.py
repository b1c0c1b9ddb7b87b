"""Gradient accumulation told from the recorded iteration itself (Recording.micro_batches): the
model called k times, k backward passes and each optimizer stepping once is k micro-batches per
step; anything else is one. The real recorder on real iterations, recorded once or twice."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import torch

from skyline_engine.attribute.creation import CreationSites
from skyline_engine.attribute.frames import CallSites
from skyline_engine.attribute.recording import IterationRecording
from skyline_engine.entry.loader import load_entry_point
from skyline_engine.measure.iteration import IterationRunner
from skyline_engine.measure.timing import TimingBudget

PROVIDERS = """
import torch


def skyline_model_provider():
    return torch.nn.Linear(8, 4)


def skyline_input_provider(batch_size=4):
    return (torch.randn(batch_size, 8),)
"""

LOOPS = {
    # (the iteration provider, the micro-batches it runs per optimizer step)
    "two micro-batches": (
        """
        def skyline_iteration_provider(model):
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            def iteration(x):
                optimizer.zero_grad()
                for half in x.chunk(2):
                    model(half).sum().backward()
                optimizer.step()
            return iteration
        """,
        2,
    ),
    "two optimizers, each stepping once": (
        """
        def skyline_iteration_provider(model):
            weights = torch.optim.SGD([model.weight], lr=0.1)
            bias = torch.optim.Adam([model.bias], lr=0.1)
            def iteration(x):
                for half in x.chunk(3):
                    model(half).sum().backward()
                weights.step()
                bias.step()
            return iteration
        """,
        3,
    ),
    "two steps, one after each micro-batch": (
        """
        def skyline_iteration_provider(model):
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            def iteration(x):
                for half in x.chunk(2):
                    optimizer.zero_grad()
                    model(half).sum().backward()
                    optimizer.step()
            return iteration
        """,
        1,
    ),
    "no optimizer": (
        """
        def skyline_iteration_provider(model):
            def iteration(x):
                for half in x.chunk(2):
                    model(half).sum().backward()
                model.zero_grad()
            return iteration
        """,
        1,
    ),
    "one backward pass for two calls": (
        """
        def skyline_iteration_provider(model):
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            def iteration(x):
                first, second = x.chunk(2)
                (model(first).sum() + model(second).sum()).backward()
                optimizer.step()
            return iteration
        """,
        1,
    ),
}


def recorded(project: Path, loop: str, iterations: int) -> IterationRecording:
    """`iterations` recorded iterations of the entry point `PROVIDERS` + `loop`."""
    (project / "entry.py").write_text(PROVIDERS + textwrap.dedent(loop), encoding="utf-8")
    entry = load_entry_point(project / "entry.py", project)
    device = torch.device("cpu")
    creation = CreationSites(CallSites(entry.files))
    with creation.recording_modules():
        runner = IterationRunner(entry, device, TimingBudget())
    with runner, runner.at_batch_size(12) as run:
        recording = IterationRecording(creation, runner.model, device)
        recording.record_first(run, runner.clock, runner.live_tensors)
        if iterations == 2:
            # One more: min(MAX_RECORDED_ITERATIONS, RECORDING_BUDGET_MS // 100 ms) - 1.
            recording.record_more(run, run_time_ms=100.0)
    assert len(recording.recorder.recording.iteration_starts) == iterations
    return recording


@pytest.mark.parametrize("iterations", [1, 2])
@pytest.mark.parametrize("case", sorted(LOOPS))
def test_micro_batches_are_counted_in_the_first_iteration(tmp_path, case, iterations):
    loop, micro_batches = LOOPS[case]
    assert recorded(tmp_path, loop, iterations).micro_batches() == micro_batches


def test_the_first_iteration_ends_where_the_second_starts(tmp_path):
    recording = recorded(tmp_path, LOOPS["two micro-batches"][0], iterations=2).recorder.recording
    first = recording.first_iteration()
    second = recording.operations[recording.iteration_starts[1] :]
    assert [op.name for op in first] == [op.name for op in second]
    assert recording.model_calls == 2  # the first iteration's, not both
