"""Tensor memory measured operation by operation, on real tensors and real training steps; and a
compiled program's own, phase by phase, through a stand-in for CUDA's allocator (no GPU here)."""

from pathlib import Path

import pytest
import torch
import torch.nn as nn

from skyline_engine.attribute.creation import CreationSites
from skyline_engine.attribute.frames import CallSites
from skyline_engine.attribute.recording import IterationRecording
from skyline_engine.entry.user_frames import ProjectFiles
from skyline_engine.measure.memory import (
    FORWARD_BACKWARD,
    OPTIMIZER,
    OTHER,
    CpuMemoryMeter,
    CudaAllocator,
    LiveTensors,
    MemoryTracker,
    is_out_of_memory,
    measure_memory,
    measure_program_memory,
)
from skyline_engine.measure.timing import CpuClock
from skyline_engine.predict.peak_memory import fit_peak_memory

MiB = 1 << 20
CPU = torch.device("cpu")


def counting():
    """A CPU meter, shown every operation while the `with` lasts."""
    meter = CpuMemoryMeter()
    return meter, MemoryTracker(meter)


def test_counts_tensors_alive_when_it_starts():
    kept = torch.empty(3 * MiB, dtype=torch.uint8)
    meter, tracker = counting()
    with tracker:
        assert meter.counter.live_bytes >= kept.untyped_storage().nbytes()
    del kept


def test_peak_is_the_largest_simultaneous_total_not_the_sum():
    meter, tracker = counting()
    with tracker:
        start = meter.counter.live_bytes
        for _ in range(5):
            scratch = torch.ones(4 * MiB, dtype=torch.uint8)
            del scratch
        peak_after_loop = meter.profile().peak_bytes
        a = torch.ones(4 * MiB, dtype=torch.uint8)
        b = torch.ones(4 * MiB, dtype=torch.uint8)
        both = meter.profile().peak_bytes
        del a, b
        after = meter.counter.live_bytes
    assert 4 * MiB <= peak_after_loop - start < 8 * MiB
    assert 8 * MiB <= both - start < 12 * MiB
    assert after - start < 1 * MiB


def test_views_share_their_storage():
    meter, tracker = counting()
    with tracker:
        start = meter.counter.live_bytes
        x = torch.ones(2 * MiB, dtype=torch.uint8)
        views = [x[i:] for i in range(10)] + [x.view(2, MiB)]
        assert meter.counter.live_bytes - start == 2 * MiB
        del x, views


def adam_step(width=512, batch=64):
    model = nn.Sequential(nn.Linear(width, 2 * width), nn.ReLU(), nn.Linear(2 * width, width))
    optimizer = torch.optim.Adam(model.parameters())
    x = torch.randn(batch, width)

    def step():
        optimizer.zero_grad()
        model(x).square().mean().backward()
        optimizer.step()

    step()  # creates Adam's state
    return model, step


def test_a_training_step_peaks_above_weights_gradients_and_optimizer_state():
    model, step = adam_step()
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    profile = measure_memory(CPU, step)
    # parameters + gradients + two Adam moments are alive at the optimizer step.
    assert profile.peak_bytes >= 4 * weight_bytes


def test_the_profile_tells_the_phases_of_an_iteration_apart():
    """Forward and backward make the gradients, the step updates the weights: each operation
    carries the phase it ran in (zero_grad, setting gradients to None, runs no operation)."""
    _, step = adam_step()
    profile = measure_memory(CPU, step)
    phases = profile.phases()
    assert [phase for _, phase in profile.phase_starts] == [FORWARD_BACKWARD, OPTIMIZER]
    assert len(phases) == len(profile.operation_bytes) == len(profile.operation_names)
    step_ops = [name for name, phase in zip(profile.operation_names, phases) if phase == OPTIMIZER]
    assert any(name.startswith(("_foreach", "add", "mul", "addcdiv", "sqrt")) for name in step_ops)
    # The optimizer's temporaries come on top of the weights, gradients and moments: with these
    # small activations the peak is in the step.
    assert profile.peak_phase == OPTIMIZER
    assert OTHER not in phases  # zero_grad(set_to_none) runs no operation


def test_out_of_memory_is_recognised_from_a_real_cpu_allocation_failure():
    try:
        torch.empty(10**15, dtype=torch.uint8)
    except RuntimeError as exc:
        assert is_out_of_memory(exc)
    else:  # pragma: no cover - a machine with a petabyte of memory
        raise AssertionError("expected the allocation to fail")
    assert not is_out_of_memory(ValueError("shapes do not match"))


@pytest.mark.parametrize(
    "message",
    [
        "CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`",
        "cuDNN error: CUDNN_STATUS_ALLOC_FAILED",
        "CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported",
        "cudaErrorMemoryAllocation: out of memory",
    ],
)
def test_cuda_libraries_that_fail_to_allocate_are_out_of_memory(message):
    # As torch raises them (RuntimeError with the library's status), not only torch.cuda.OutOfMemoryError:
    # an analysis then backs off to a smaller batch size instead of failing as a user error.
    assert is_out_of_memory(RuntimeError(message))
    assert not is_out_of_memory(RuntimeError("CUBLAS_STATUS_EXECUTION_FAILED when calling `cublasSgemm`"))


def test_the_recorder_measures_the_same_profile_as_a_plain_iteration():
    # The user's batch size has its memory measured by the recorder, in the iteration recorded
    # for the breakdown: it must agree with a plain measured iteration operation for operation
    # (the batch-size models line them up), so the recorder must keep no tensor alive of its own
    # and run the same operations.
    model, step = adam_step()
    plain = measure_memory(CPU, step)
    creation = CreationSites(CallSites(ProjectFiles(Path(__file__).parent)))
    recording = IterationRecording(creation, model, CPU)
    recorded, _ = recording.record_first(step, CpuClock(), LiveTensors())
    assert recording.recorder.recording.operations  # it did record
    assert recorded == plain


FROZEN_IMPORTS = """
import sys
import torch
from skyline_engine.measure.memory import LiveTensors, StorageCounter, freeze_imports

kept_at_import = torch.zeros(1000)  # a tensor made while importing, as a library's constant is
if sys.argv[1] == "freeze":
    freeze_imports()
model = torch.nn.Linear(64, 32)  # the analysis's own
live = LiveTensors()
with live.frozen():
    print(StorageCounter(live).live_bytes)
"""


@pytest.mark.slow  # two fresh processes
def test_a_worker_that_froze_its_imports_counts_the_same_tensors_and_walks_fewer_objects():
    """The warm worker freezes what it imported before its job (`freeze_imports`): every tensor
    alive still counts, to the byte, and the collector's scans walk only what came after."""
    import subprocess
    import sys

    counted = {}
    for mode in ("freeze", "plain"):
        result = subprocess.run(
            [sys.executable, "-c", FROZEN_IMPORTS, mode], capture_output=True, text=True, check=True, timeout=120
        )
        counted[mode] = int(result.stdout)
    assert counted["freeze"] == counted["plain"] >= (1000 + 64 * 32 + 32) * 4
    # What the first collection and scan of an analysis no longer walk: gc.get_objects() after
    # freeze_imports holds a fraction of what torch's import made.
    check = subprocess.run(
        [sys.executable, "-c", "import gc, torch\nfrom skyline_engine.measure.memory import freeze_imports\n"
         "before = len(gc.get_objects())\nfreeze_imports()\nprint(before, len(gc.get_objects()))"],
        capture_output=True, text=True, check=True, timeout=120,
    )  # fmt: skip
    before, after = map(int, check.stdout.split())
    assert after < before / 10


class StandInAllocator(CudaAllocator):
    """Stands in for CUDA's caching allocator, which this machine lacks (the one seam between the
    CUDA meters and the device): the bytes allocated are what the test's iteration says it
    allocated and freed, as a compiled program's kernels would."""

    def __init__(self, start: int) -> None:
        super().__init__(torch.device("cpu"))
        self.now = self.peak = start

    def allocate(self, size: int) -> None:
        self.now += size
        self.peak = max(self.peak, self.now)

    def free(self, size: int) -> None:
        self.now -= size

    def allocated(self) -> int:
        return self.now

    def reserved(self) -> int:
        return 1 << 20

    def peaks_since_reset(self) -> tuple[int, int]:
        peaks = self.peak, 1 << 20
        self.peak = self.now
        return peaks


class AllocatingSGD(torch.optim.SGD):
    """An optimizer whose step allocates scratch space, freed before it returns."""

    allocator: StandInAllocator
    scratch = 300

    def step(self, closure=None):
        self.allocator.allocate(self.scratch)
        self.allocator.free(self.scratch)
        return super().step(closure)


def program_iteration(allocator: StandInAllocator, batch_size: int):
    model = nn.Linear(4, 2)
    optimizer = AllocatingSGD(model.parameters(), lr=0.1)
    optimizer.allocator = allocator

    def iteration() -> None:
        allocator.allocate(10 * batch_size)  # the inputs, before any module runs
        loss = model(torch.randn(batch_size, 4)).sum()
        allocator.allocate(100 * batch_size)  # what the fused forward keeps for backward
        loss.backward()
        allocator.free(100 * batch_size)
        optimizer.step()
        allocator.free(10 * batch_size)

    return iteration


def test_a_compiled_programs_memory_is_its_allocators_peak_in_each_phase():
    """measure_program_memory: one entry per phase, the allocator's peak in it, no dispatch mode."""
    allocator = StandInAllocator(start=1_000)
    profile = measure_program_memory(torch.device("cuda"), program_iteration(allocator, 8), allocator)
    assert profile.program
    # Told by the optimizer's step alone: forward and backward until it (the inputs made first
    # among them), the step, and what follows.
    assert profile.operation_names == (
        "forward_backward (compiled program)",
        "optimizer (compiled program)",
        "other (compiled program)",
    )
    assert profile.operation_bytes == (1_880, 1_380, 1_080)
    assert (profile.start_bytes, profile.peak_bytes, profile.peak_phase) == (1_000, 1_880, "forward_backward")
    # Two batch sizes give the peak-memory model a line through each phase's peaks, as the
    # operations' do for an eager model: 1,000 + 110 bytes a sample, in forward and backward.
    wide_allocator = StandInAllocator(start=1_000)
    wider = measure_program_memory(torch.device("cuda"), program_iteration(wide_allocator, 16), wide_allocator)
    assert wider.operation_names == profile.operation_names
    model = fit_peak_memory([8, 16], [profile, wider])
    assert model(64) == pytest.approx(1_000 + 110 * 64)
    assert model.phase_at(64).name == "forward_backward"


@pytest.mark.slow  # compiles a model
def test_measuring_a_compiled_programs_memory_compiles_nothing_again():
    """A compiled model that compiled under a global module hook (a training script's runs under
    the engine's model finder, measure/script_model.py) compiles again once another is added
    (with the hook the eager meters add, one more graph); the program's meter adds none."""
    from skyline_engine.measure.compilation import compiler_work, quiet_about_global_hooks

    quiet_about_global_hooks()
    finder = torch.nn.modules.module.register_module_forward_pre_hook(lambda module, args: None)
    try:
        model = torch.compile(nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2)))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        inputs = torch.randn(4, 8)

        def iteration() -> None:
            optimizer.zero_grad()
            model(inputs).sum().backward()
            optimizer.step()

        for _ in range(2):
            iteration()
        compiled = compiler_work()
        assert compiled.graphs >= 1
        profile = measure_program_memory(torch.device("cuda"), iteration, StandInAllocator(start=0))
        assert compiler_work() == compiled
    finally:
        finder.remove()
    assert [name.split()[0] for name in profile.operation_names] == ["forward_backward", "optimizer", "other"]
