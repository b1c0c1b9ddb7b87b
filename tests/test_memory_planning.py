"""Planning for a memory capacity on an optimizer-dominated model, checked against the truth found
by measuring: the largest batch size predicted to fit must fit, and 5 % more must not.

On a CPU tensor memory is counted exactly, so this holds whatever the machine's load; the model
(tests/projects/optimizer_dominated) peaks in optimizer.step() at the measured batch sizes and in
the backward pass at the capacity's limit, where one line through the measured peaks would be
far off.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from conftest import run_skyline
from engine_helpers import SERVE_QUICK, analysed
from skyline_engine.entry.loader import load_entry_point
from skyline_engine.measure.iteration import IterationRunner
from skyline_engine.predict.linear import fit_line
from skyline_engine.vocabulary import FORWARD_BACKWARD, OPTIMIZER

pytestmark = pytest.mark.slow  # analyses and the CLI

PROJECT = Path(__file__).parent / "projects" / "optimizer_dominated"
# Whether a memory-only probe is affordable depends on the iteration's time, which a busy machine
# stretches (CI once found none affordable): these budgets leave a wide margin for the probes the
# tests expect, and none for one at a batch size of millions.
PLANNING = dataclasses.replace(SERVE_QUICK, memory_probe_s=600.0)
FURTHER = dataclasses.replace(SERVE_QUICK, memory_probe_s=60.0)
CAPACITY = 64 << 20


@pytest.fixture(scope="module")
def document():
    return analysed(PROJECT, budget=PLANNING, memory_capacity_bytes=CAPACITY)


def measured_peak(batch_size: int, project: Path = PROJECT) -> int:
    """The real peak of one steady-state iteration at `batch_size`."""
    entry = load_entry_point(project / "entry_point.py", project)
    cpu = torch.device("cpu")
    try:
        with IterationRunner(entry, cpu, SERVE_QUICK) as runner, runner.at_batch_size(batch_size) as run:
            runner.warm_up(run)
            return runner.memory(run).peak_bytes
    finally:
        entry.unload()


def test_the_capacity_given_is_the_one_planned_for(document):
    assert document["device"]["memory_capacity_bytes"] == CAPACITY
    assert document["device"]["memory_capacity_source"] == "user"
    assert document["models"]["usable_memory_bytes"] == int(CAPACITY * 0.9)


def test_the_peak_moves_from_the_optimizer_step_to_the_backward_pass(document):
    samples = document["models"]["samples"]
    assert {s["peak_memory_phase"] for s in samples} == {OPTIMIZER}
    assert document["models"]["peak_memory_bytes"]["phase_at_max_batch_size"] == FORWARD_BACKWARD


def test_the_largest_batch_size_predicted_to_fit_is_the_true_one_within_5_percent(document):
    models = document["models"]
    largest, usable = models["max_batch_size"], models["usable_memory_bytes"]
    assert measured_peak(largest) <= usable
    assert measured_peak(int(largest * 1.05) + 1) > usable
    # One line through the measured peaks, as Skyline fits it, would say many times more.
    samples = models["samples"]
    line = fit_line([s["batch_size"] for s in samples], [s["peak_memory_bytes"] for s in samples])
    assert line.inverse(usable) > 5 * largest


def test_the_limit_is_measured_when_affordable_so_the_answer_is_not_an_extrapolation(document):
    models = document["models"]
    largest = models["max_batch_size"]
    assert largest > models["trusted_range"][1]  # beyond what was timed...
    assert largest in [s["batch_size"] for s in models["memory_samples"]]  # ...but its memory was measured
    assert not models["max_batch_size_extrapolated"]


def test_the_command_line_plans_for_a_capacity(tmp_path):
    out = tmp_path / "analysis.json"
    result = run_skyline(
        "profile",
        "entry_point.py",
        "--device",
        "cpu",
        "--memory-capacity",
        "64MiB",
        "--json",
        out,
        "--quiet",
        cwd=PROJECT,
    )
    assert result.returncode == 0, result.stderr
    models = json.loads(out.read_text())["models"]
    largest = models["max_batch_size"]
    # Whether the limit could be measured within the time budget depends on the machine's load.
    said = f"says {largest:,}, set by" if models["max_batch_size_extrapolated"] else f"{largest:,}, set by"
    line = next(line for line in result.stdout.splitlines() if line.startswith("Largest fit"))
    assert said in line and "set by the forward and backward pass" in line, line
    bad = run_skyline("profile", "entry_point.py", "--memory-capacity", "lots", cwd=PROJECT)
    assert bad.returncode == 2 and "'lots' is not a size" in bad.stderr


def test_memory_alone_is_measured_further_when_the_operations_differ_between_batch_sizes():
    """tests/projects/branching takes a branch from 48 samples on: its profiles at 16, 32 and 64
    do not line up, so memory alone is measured at 4 and 16 times the largest, and the model,
    fitted per phase over all of them, reproduces those peaks."""
    project = Path(__file__).parent / "projects" / "branching"
    doc = analysed(project, budget=FURTHER)
    models = doc["models"]
    assert [s["batch_size"] for s in models["samples"]] == [16, 32, 64]
    assert [s["batch_size"] for s in models["memory_samples"]] == [256, 4096]
    memory = models["peak_memory_bytes"]
    assert memory["fitted"] == "per_phase"
    for sample in models["memory_samples"]:
        b = sample["batch_size"]
        predicted = max(line["slope"] * b + line["bias"] for line in memory["phases"])
        assert predicted == pytest.approx(sample["peak_memory_bytes"], rel=0.01)
    # What was timed, or the largest timed where the probe past it found the time line bending (or
    # none fit the budget), or the probe where it held short of 4 × 64.
    end = 64 if models["line_bends_at"] or models["range_unprobed"] else models["range_probed_to"] or 4 * 64
    assert models["trusted_range"] == [16, end]


def test_memory_that_grows_with_the_batch_size_squared_is_planned_for_exactly():
    """tests/projects/contrastive compares every sample with every other (batch × batch logits):
    lines through its operations at 32, 64 and 128 samples miss, so memory alone is measured at
    512, and a quadratic through the four, checked by the fourth, finds the true limit; time is
    trusted no further than what was timed."""
    project = Path(__file__).parent / "projects" / "contrastive"
    doc = analysed(project, budget=PLANNING, memory_capacity_bytes=CAPACITY)
    models = doc["models"]
    assert [s["batch_size"] for s in models["samples"]] == [32, 64, 128]
    assert 512 in [s["batch_size"] for s in models["memory_samples"]]
    memory = models["peak_memory_bytes"]
    assert memory["quadratic"] > 0 and memory["max_relative_residual"] < 0.01
    largest, usable = models["max_batch_size"], models["usable_memory_bytes"]
    assert measured_peak(largest, project) <= usable
    assert measured_peak(int(largest * 1.05) + 1, project) > usable
    assert models["trusted_range"] == [32, 128]
    assert any("square of the batch size" in w and "(128)" in w for w in doc["warnings"])
