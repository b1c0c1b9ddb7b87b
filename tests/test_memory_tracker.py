"""The CPU peak-memory tracker, on real tensors and a real training step."""

from pathlib import Path

import torch
import torch.nn as nn

from skyline_engine.attribute.frames import CallSites
from skyline_engine.attribute.recorder import OperationRecorder
from skyline_engine.entry.user_frames import ProjectFiles
from skyline_engine.measure.memory import StorageCounter, TensorMemoryTracker, is_out_of_memory, measure_peak_bytes

MiB = 1 << 20


def test_counts_tensors_alive_when_it_starts():
    kept = torch.empty(3 * MiB, dtype=torch.uint8)
    with TensorMemoryTracker() as tracker:
        assert tracker.live_bytes >= kept.untyped_storage().nbytes()
    del kept


def test_peak_is_the_largest_simultaneous_total_not_the_sum():
    with TensorMemoryTracker() as tracker:
        start = tracker.live_bytes
        for _ in range(5):
            scratch = torch.ones(4 * MiB, dtype=torch.uint8)
            del scratch
        peak_after_loop = tracker.peak_bytes
        a = torch.ones(4 * MiB, dtype=torch.uint8)
        b = torch.ones(4 * MiB, dtype=torch.uint8)
        both = tracker.peak_bytes
        del a, b
        after = tracker.live_bytes
    assert 4 * MiB <= peak_after_loop - start < 8 * MiB
    assert 8 * MiB <= both - start < 12 * MiB
    assert after - start < 1 * MiB


def test_views_share_their_storage():
    with TensorMemoryTracker() as tracker:
        start = tracker.live_bytes
        x = torch.ones(2 * MiB, dtype=torch.uint8)
        views = [x[i:] for i in range(10)] + [x.view(2, MiB)]
        assert tracker.live_bytes - start == 2 * MiB
        del x, views


def test_a_training_step_peaks_above_weights_gradients_and_optimizer_state():
    model = nn.Linear(512, 512)
    optimizer = torch.optim.Adam(model.parameters())
    x = torch.randn(64, 512)
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())

    def step():
        optimizer.zero_grad()
        model(x).square().mean().backward()
        optimizer.step()

    step()  # creates Adam's state
    peak = measure_peak_bytes(torch.device("cpu"), step)
    # parameters + gradients + two Adam moments are alive at the optimizer step.
    assert peak >= 4 * weight_bytes


def test_out_of_memory_is_recognised_from_a_real_cpu_allocation_failure():
    try:
        torch.empty(10**15, dtype=torch.uint8)
    except RuntimeError as exc:
        assert is_out_of_memory(exc)
    else:  # pragma: no cover - a machine with a petabyte of memory
        raise AssertionError("expected the allocation to fail")
    assert not is_out_of_memory(ValueError("shapes do not match"))


def test_the_recorder_counts_the_same_peak_as_the_tracker():
    # The user's batch size has its peak counted by the recorder, in the iteration recorded for
    # the breakdown: it must agree with a plain tracked iteration, so the recorder must keep no
    # tensor alive of its own.
    model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 256))
    optimizer = torch.optim.Adam(model.parameters())
    x = torch.randn(64, 256)

    def step():
        optimizer.zero_grad()
        model(x).square().mean().backward()
        optimizer.step()

    step()
    device = torch.device("cpu")
    plain = measure_peak_bytes(device, step)
    counter = StorageCounter()
    recorder = OperationRecorder(CallSites(ProjectFiles(Path(__file__).parent)), {}, device, memory=counter)
    with recorder:
        recorder.start_iteration()
        step()
    assert recorder.recording.operations  # it did record
    assert counter.peak_bytes == plain
