"""Batch-size probing with real out-of-memory failures.

The entry points below ask the CPU allocator for 10 TB above some batch size: a real allocation
failure, the same kind the engine meets when a probe does not fit in device memory.
"""

import textwrap

import pytest
import torch

from skyline_engine.analysis.session import AnalysisRequest, analyze
from skyline_engine.entry.loader import load_entry_point
from skyline_engine.errors import OutOfMemory
from skyline_engine.measure.iteration import IterationRunner, OutOfMemoryAtBatchSize
from skyline_engine.measure.timing import TimingBudget

QUICK = TimingBudget(warmup_iterations=1, min_run_s=0.02, max_run_s=0.2)


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


def test_a_probe_that_runs_out_of_memory_narrows_the_range(tmp_path):
    write_entry(tmp_path, default_batch_size=32, fits_up_to=40)
    doc = analyze(AnalysisRequest("entry.py", tmp_path, device="cpu", budget=QUICK)).to_dict()
    measured = [s["batch_size"] for s in doc["models"]["samples"]]
    # 32 (the user's), 16 (half); 64 and then 48 run out of memory; 40 fits.
    assert measured == [16, 32, 40]
    assert any("64 ran out of memory" in w for w in doc["warnings"])
    assert any("48 ran out of memory" in w for w in doc["warnings"])
    assert doc["batch_size"] == 32


def test_when_nothing_larger_fits_smaller_batch_sizes_are_measured(tmp_path):
    write_entry(tmp_path, default_batch_size=32, fits_up_to=32)
    doc = analyze(AnalysisRequest("entry.py", tmp_path, device="cpu", budget=QUICK)).to_dict()
    measured = [s["batch_size"] for s in doc["models"]["samples"]]
    assert measured == [8, 16, 32]
    assert doc["models"]["peak_memory_bytes"]["r2"] is not None


def test_the_users_batch_size_running_out_of_memory_is_an_error_at_its_line(tmp_path):
    entry = write_entry(tmp_path, default_batch_size=64, fits_up_to=40)
    line = next(i for i, text in enumerate(entry.read_text().splitlines(), 1) if "batch_size=64" in text)
    with pytest.raises(OutOfMemory) as caught:
        analyze(AnalysisRequest("entry.py", tmp_path, device="cpu", budget=QUICK)).to_dict()
    error = caught.value
    assert (error.path, error.line) == ("entry.py", line)
    assert "batch size 64 does not fit" in error.message


def test_batch_size_one_still_gets_three_probes(tmp_path):
    write_entry(tmp_path, default_batch_size=1, fits_up_to=1000)
    doc = analyze(AnalysisRequest("entry.py", tmp_path, device="cpu", budget=QUICK)).to_dict()
    assert [s["batch_size"] for s in doc["models"]["samples"]] == [1, 2, 3]


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
        with IterationRunner(loaded, torch.device("cpu"), QUICK) as runner:
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
