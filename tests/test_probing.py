"""Batch-size probing with real out-of-memory failures, and its decisions on written measurements.

The entry points below ask the CPU allocator for 10 TB above some batch size: a real allocation
failure, the same kind the engine meets when a probe does not fit in device memory.
"""

import textwrap

import pytest
import torch

from engine_helpers import SERVE_QUICK, analysed, marked_line
from skyline_engine.analysis.probing import Probing
from skyline_engine.entry.loader import load_entry_point
from skyline_engine.errors import OutOfMemory, UserCodeError
from skyline_engine.measure.iteration import IterationRunner, OutOfMemoryAtBatchSize
from skyline_engine.measure.memory import MemoryProfile
from skyline_engine.predict.peak_memory import fit_peak_memory
from skyline_engine.vocabulary import FORWARD_BACKWARD


def write_entry(folder, default_batch_size, fits_up_to):
    entry = folder / "entry.py"
    entry.write_text(
        textwrap.dedent(
            f"""\
            import torch
            import torch.nn as nn


            class Model(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.fc = nn.Linear(8, 1)

                def forward(self, x):
                    if x.shape[0] > {fits_up_to}:
                        torch.empty(10**13, dtype=torch.uint8)  # more than any machine has
                    return self.fc(x).square().mean()


            def skyline_model_provider():
                return Model()


            def skyline_input_provider(batch_size={default_batch_size}):
                return (torch.randn(batch_size, 8),)


            def skyline_iteration_provider(model):
                optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

                def iteration(x):
                    optimizer.zero_grad()
                    model(x).backward()
                    optimizer.step()

                return iteration
            """
        )
    )
    return entry


@pytest.mark.slow
def test_a_probe_that_runs_out_of_memory_narrows_the_range(tmp_path):
    write_entry(tmp_path, default_batch_size=32, fits_up_to=40)
    doc = analysed(tmp_path, "entry.py", budget=SERVE_QUICK)
    measured = [s["batch_size"] for s in doc["models"]["samples"]]
    # 32 (the user's), 16 (half); 64 and then 48 run out of memory; 40 fits.
    assert measured == [16, 32, 40]
    assert any("64 ran out of memory" in w for w in doc["warnings"])
    assert any("48 ran out of memory" in w for w in doc["warnings"])
    assert doc["batch_size"] == 32


@pytest.mark.slow
def test_when_nothing_larger_fits_smaller_batch_sizes_are_measured(tmp_path):
    write_entry(tmp_path, default_batch_size=32, fits_up_to=32)
    doc = analysed(tmp_path, "entry.py", budget=SERVE_QUICK)
    measured = [s["batch_size"] for s in doc["models"]["samples"]]
    assert measured == [8, 16, 32]
    assert doc["models"]["peak_memory_bytes"]["r2"] is not None


@pytest.mark.slow
def test_the_users_batch_size_running_out_of_memory_is_an_error_at_its_line(tmp_path):
    entry = write_entry(tmp_path, default_batch_size=64, fits_up_to=40)
    line = marked_line(entry, "batch_size=64")
    with pytest.raises(OutOfMemory) as caught:
        analysed(tmp_path, "entry.py", budget=SERVE_QUICK)
    error = caught.value
    assert (error.path, error.line) == ("entry.py", line)
    assert "batch size 64 does not fit" in error.message


@pytest.mark.slow
def test_batch_size_one_still_gets_three_probes(tmp_path):
    write_entry(tmp_path, default_batch_size=1, fits_up_to=1000)
    doc = analysed(tmp_path, "entry.py", budget=SERVE_QUICK)
    assert [s["batch_size"] for s in doc["models"]["samples"]] == [1, 2, 3]


@pytest.mark.slow
def test_the_out_of_memory_error_keeps_no_tensor_of_the_failed_iteration(tmp_path):
    """The error reporting an out-of-memory must not keep the failed iteration's tensors alive:
    on CUDA, releasing cached memory while it propagates would free nothing, and the next, smaller
    probe would find the memory still taken. (The original exception's traceback holds the frames
    that hold them; an error raised inside its handler would keep it as its context. #14 item 5.)"""
    entry = write_entry(tmp_path, default_batch_size=32, fits_up_to=40)
    entry.write_text(
        entry.read_text()
        .replace("import torch\n", "import weakref\n\nimport torch\n\nACTIVATIONS = []\n", 1)
        .replace(
            "if x.shape[0] >",
            "activation = x * 2\n        ACTIVATIONS.append(weakref.ref(activation))\n        if x.shape[0] >",
        )
    )
    loaded = load_entry_point(entry, tmp_path)
    try:
        with IterationRunner(loaded, torch.device("cpu"), SERVE_QUICK) as runner:
            with pytest.raises(OutOfMemoryAtBatchSize) as caught, runner.at_batch_size(64) as run:
                run()
            # While the error is held (as it is while it propagates through the cleanup that
            # releases cached memory), the tensors are gone, by reference counting alone.
            assert caught.value.batch_size == 64
            activations = loaded.module.ACTIVATIONS
            assert len(activations) == 1
            assert activations[0]() is None
    finally:
        loaded.unload()


# --- when to probe further, on injected measurements ----------------------------------------------
# Memory is measured per operation by the engine; here each batch size's profile is written
# down, so that the decision under test sees exactly these bytes.

GiB = 1 << 30


def profile_of(batch_size, baseline=2 * GiB, per_sample=17 << 10, per_sample_squared=20):
    """One operation holding the weights, 17 KiB a sample and a batch × batch matrix."""
    held = baseline + per_sample * batch_size + per_sample_squared * batch_size**2
    return MemoryProfile(baseline, (held,), ("mm.default",), ((0, FORWARD_BACKWARD),))


def probing_of(user, measure, usable=4 * GiB):
    return Probing(measure, usable, lambda *_: None, user, measure(user))


def test_a_curve_under_a_large_baseline_is_probed_at_a_fourth_batch_size():
    # 2 GiB alive before the iteration: lines through 32, 64 and 128 samples miss the peaks by
    # 0.002 %, but the logits' quadratic would cross the usable memory far below where they do.
    probing = probing_of(64, profile_of)
    assert probing.probe() == [32, 64, 128]
    probing.settle_memory(seconds_per_sample=1e-6, budget_s=60.0)
    assert 512 in probing.memory_only
    known = {**probing.memory, **probing.memory_only}
    model = fit_peak_memory(list(known), list(known.values()))
    assert model.quadratic
    limit = model.largest_within(4 * GiB)
    assert profile_of(limit).peak_bytes <= 4 * GiB < profile_of(limit + 1).peak_bytes


def test_nothing_past_a_batch_size_the_users_code_fails_at_is_probed():
    asked = []

    def measure(batch_size):
        asked.append(batch_size)
        if batch_size >= 16:
            raise UserCodeError("ValueError: cannot handle it (raised while running …).", path="model.py", line=3)
        return profile_of(batch_size, per_sample_squared=0)

    probing = probing_of(8, measure, usable=2 * GiB + 100 * (17 << 10))  # the memory fits 100 samples
    assert probing.probe() == [2, 4, 8]
    probing.settle_memory(seconds_per_sample=1e-6, budget_s=60.0)  # the limit, 100, is not measured
    assert asked == [8, 4, 16, 2] and probing.failing == [16] and not probing.memory_only
    assert probing.notes == [
        "model.py:3: ValueError: cannot handle it (raised while running …). The models leave batch size 16 "
        "out and are no guide from it on."
    ]


def test_failures_at_one_line_are_one_warning_naming_each_batch_size():
    # The probe fails at 32, then the confirming step at 31 (analysis/session.py): one warning,
    # led by the failure nearest the user's batch size; another line's failure keeps its own.
    probing = probing_of(16, lambda b: profile_of(b, per_sample_squared=0))

    def error(batch_size, line=9):
        return UserCodeError(f"ValueError: empty at {batch_size}.\nTraceback …", path="entry_point.py", line=line)

    probing.fails(32, error(32))
    probing.fails(31, error(31))
    probing.fails(4, error(4))
    probing.fails(64, error(64, line=12))
    assert probing.failing == [32, 31, 4, 64]
    assert probing.notes == [
        "entry_point.py:9: ValueError: empty at 31. The models leave batch sizes 31, 32 out and are no guide "
        "from 31 on.",
        "entry_point.py:9: ValueError: empty at 4. The models leave batch size 4 out and are no guide at it and below.",
        "entry_point.py:12: ValueError: empty at 64. The models leave batch size 64 out and are no guide from it on.",
    ]
