"""torch.compile: the compiled iteration is timed, compiling is reported apart from it, memory counts
only real tensors, and the breakdown says it comes from an eager run of the same iteration.

tests/projects/training_loops/compiled.py compiles an MLP with static shapes (every batch size
compiles its own graphs), with the inductor CPU backend; eager.py is the same model and iteration
uncompiled.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from engine_helpers import SERVE_QUICK, analysed
from skyline_engine.render.terminal import render_report

pytestmark = pytest.mark.slow  # analyses of a compiled model

PROJECT = Path(__file__).parent / "projects" / "training_loops"


@pytest.fixture(scope="module")
def compiled():
    return analysed(PROJECT, "compiled.py", budget=SERVE_QUICK)


@pytest.fixture(scope="module")
def eager():
    return analysed(PROJECT, "eager.py", budget=SERVE_QUICK)


def test_memory_counts_only_real_tensors(compiled, eager):
    # The compiler keeps fake tensors (storage on `meta`) of hundreds of MiB: none is memory. On
    # the CPU the count comes from the eager replay, so it is the uncompiled model's to the byte
    # (on CUDA, the compiled program's own: bench/gpu_check.py).
    assert compiled["compilation"]["peak_memory"] == "eager_replay"
    assert compiled["iteration"]["peak_memory_bytes"] == eager["iteration"]["peak_memory_bytes"]
    for sample, same in zip(compiled["models"]["samples"], eager["models"]["samples"]):
        assert (sample["batch_size"], sample["peak_memory_bytes"]) == (same["batch_size"], same["peak_memory_bytes"])


def test_each_batch_size_compiles_in_its_warm_up_and_is_reported_apart(compiled, eager):
    assert eager["compilation"] is None
    compilation = compiled["compilation"]
    by_size = {entry["batch_size"]: entry for entry in compilation["batch_sizes"]}
    # Static shapes: a graph (forward and backward) for each batch size timed (for the models, and
    # beside the user's to confirm the recommendation), the user's first.
    assert compilation["batch_sizes"][0]["batch_size"] == compiled["batch_size"]
    models = compiled["models"]
    assert sorted(by_size) == sorted({s["batch_size"] for s in models["samples"] + models["checks"]})
    assert all(entry["graphs"] >= 1 and entry["seconds"] > 0 for entry in by_size.values())
    assert compilation["graphs"] == sum(entry["graphs"] for entry in by_size.values())


def test_the_breakdown_says_it_comes_from_an_eager_replay(compiled, eager):
    assert compiled["attribution"]["mode"] == "eager_replay"
    assert eager["attribution"]["mode"] == "recorded"
    model_lines = {e["line"]: e for e in compiled["lines"] if e["path"] == "model.py"}
    assert model_lines[12]["forward_ms"] > 0 and model_lines[12]["backward_ms"] > 0  # hidden = self.body(x)
    notes = [w for w in compiled["warnings"] if w.startswith("The model is compiled (torch.compile)")]
    assert len(notes) == 1 and "eager run of the same iteration" in notes[0]
    assert not any(w.startswith("The model is compiled") for w in eager["warnings"])


def test_the_report_shows_what_was_compiled(compiled):
    summary = render_report(compiled).split("\n\n")[1].splitlines()
    start = next(i for i, line in enumerate(summary) if line.startswith("Compiled"))
    compilation = compiled["compilation"]
    first, *later = compilation["batch_sizes"]
    assert summary[start : start + 2] == [
        f"Compiled     torch.compile: {compilation['graphs']} graph(s) in {compilation['seconds']:.1f} s, compiled "
        "in warm-ups and not in the iteration's time",
        f"             {first['graphs']} at batch size {first['batch_size']} ({first['seconds']:.1f} s); recompiled "
        "for new shapes: " + ", ".join(f"{b['graphs']} at {b['batch_size']} ({b['seconds']:.1f} s)" for b in later),
    ]
