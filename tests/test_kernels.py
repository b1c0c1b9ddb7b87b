"""Each operation's kernel time on CUDA (attribute/kernels.py), tested without a GPU.

The GPU is absent here, so two things stand in for it, and say so: Kineto trace events written by
hand in its format (a kernel correlated with the runtime call that launched it, on the host thread
of the operation's range), and `StandInForGpu`, a capture that runs the real torch.profiler on the
CPU around the real recorder and writes one kernel per operation's range into the real trace, as
CUPTI would. Everything else is real: the ranges the recorder opens, Kineto's trace of them, the
correlation, the breakdown. On a GPU, bench/gpu_check.sh compares the result with torch.profiler's
own device time per operation.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from skyline_engine.attribute.kernels import KERNELS, SPANS, KernelCapture, kernel_ms_by_operation, range_name
from test_recorder import STEPS, recorded

HOST, AUTOGRAD = 101, 202  # the iteration's thread and autograd's device thread


def host_range(serial: int, ts: float, dur: float, tid: int = HOST) -> dict[str, Any]:
    return {"ph": "X", "cat": "user_annotation", "name": range_name(serial), "pid": 7, "tid": tid, "ts": ts, "dur": dur}


def launch(correlation: int, ts: float, tid: int = HOST, category: str = "cuda_runtime") -> dict[str, Any]:
    name = "cudaLaunchKernel" if category == "cuda_runtime" else "cuLaunchKernel"
    return {
        "ph": "X",
        "cat": category,
        "name": name,
        "pid": 7,
        "tid": tid,
        "ts": ts,
        "dur": 3.0,
        "args": {"correlation": correlation, "External id": 99},
    }


def on_device(correlation: int, dur_us: float, category: str = "kernel") -> dict[str, Any]:
    return {
        "ph": "X",
        "cat": category,
        "name": "volta_sgemm_128x64_nn",
        "pid": 0,
        "tid": 7,  # the stream
        "ts": 5_000.0 + correlation,
        "dur": dur_us,
        "args": {"correlation": correlation, "device": 0, "stream": 7},
    }


def test_each_kernel_belongs_to_the_operation_whose_range_launched_it():
    events = [
        host_range(0, ts=100, dur=50),  # a forward mm: two kernels
        launch(1, ts=110),
        launch(2, ts=140),
        on_device(1, 300.0),
        on_device(2, 20.0),
        host_range(1, ts=160, dur=10),  # a view-like operation that launched nothing
        host_range(2, ts=180, dur=30),  # a copy to the device, a fill, and a Triton kernel (driver API)
        launch(3, ts=185, category="cuda_runtime"),
        on_device(3, 40.0, category="gpu_memcpy"),
        launch(4, ts=190),
        on_device(4, 5.0, category="gpu_memset"),
        launch(5, ts=200, category="cuda_driver"),
        on_device(5, 15.0),
        # Backward on autograd's device thread, overlapping the host thread's ranges in time: the
        # launch's own thread decides.
        host_range(3, ts=120, dur=60, tid=AUTOGRAD),
        launch(6, ts=165, tid=AUTOGRAD),
        on_device(6, 700.0),
        # A launch in no range (the profiler's own, an unrecorded operation) counts for none, and
        # the device twin of a range (gpu_user_annotation) is no host range.
        launch(7, ts=500),
        on_device(7, 1_000.0),
        {**host_range(9, ts=0, dur=10_000), "cat": "gpu_user_annotation"},
        # A launch whose kernel Kineto lost, and the flow arrows Kineto draws, change nothing.
        launch(8, ts=105),
        {"ph": "s", "cat": "ac2g", "name": "ac2g", "id": 1, "pid": 7, "tid": HOST, "ts": 110},
    ]
    assert kernel_ms_by_operation(events) == pytest.approx({0: 0.32, 1: 0.0, 2: 0.06, 3: 0.7})


def test_a_launch_at_a_ranges_edges_is_inside_and_just_after_it_outside():
    events = [host_range(0, ts=100, dur=50), launch(1, ts=100), on_device(1, 10.0), launch(2, ts=150.5)]
    events += [on_device(2, 90.0), host_range(1, ts=151, dur=5), launch(3, ts=156), on_device(3, 1.0)]
    assert kernel_ms_by_operation(events) == pytest.approx({0: 0.01, 1: 0.001})


class StandInForGpu(KernelCapture):
    """Stands in for a GPU: torch.profiler on the CPU only, and in the real trace it writes, one
    kernel per `skyline#<n>` range, launched from the range's middle on its thread, lasting
    (n + 1) µs, in Kineto's format."""

    def activities(self) -> list[Any]:
        return [torch.profiler.ProfilerActivity.CPU]

    def trace_events(self, profiler: Any) -> list[dict[str, Any]]:
        events = super().trace_events(profiler)
        ranges = [e for e in events if e.get("cat") == "user_annotation" and e["name"].startswith("skyline#")]
        for correlation, span in enumerate(ranges, start=1):
            serial = int(span["name"].removeprefix("skyline#"))
            events.append(launch(correlation, span["ts"] + span["dur"] / 2, tid=span["tid"]))
            events[-1]["pid"] = span["pid"]
            events.append(on_device(correlation, float(serial + 1)))
        StandInForGpu.ranges_seen = len(ranges)
        return events


class NoKernels(StandInForGpu):
    """Stands in for a GPU whose CUPTI records no kernel: the real CPU trace, nothing added."""

    def trace_events(self, profiler: Any) -> list[dict[str, Any]]:
        return KernelCapture.trace_events(self, profiler)


@pytest.mark.slow
def test_recorded_operations_take_the_kernel_time_their_ranges_launched(tmp_path):
    # A forward pass, its backward and an optimizer step: every phase launches kernels on a GPU.
    result = recorded(tmp_path, STEPS, iterations=3, kernel_capture=StandInForGpu)
    recording, memory = result.iterations, result.memory
    operations = result.recording.operations
    phases = {op.phase for op in operations}
    assert phases == {"forward", "backward", "optimizer"}
    # Each capture saw one range per operation it recorded (the last capture: the iterations after
    # the first), and every operation took its own kernel's time, its span kept beside it.
    iterations = len(result.recording.iteration_starts)
    assert StandInForGpu.ranges_seen == len(operations) * (iterations - 1) // iterations
    serials = sorted(round(op.duration_ms * 1000) - 1 for op in operations)
    assert serials == list(range(len(operations)))
    assert all(op.span_ms is not None and op.span_ms > 0 for op in operations)
    breakdown = recording.breakdown(run_time_ms=10.0, peak_memory_bytes=memory.peak_bytes, timeline=True)
    assert breakdown.attribution.device_time == KERNELS
    assert breakdown.attribution.device_time_fallback is None
    first = breakdown.timeline
    assert first is not None and [entry.span_ms for entry in first] == [op.span_ms for op in operations[: len(first)]]
    # The lines hold the kernels' time: each operation at its fastest over the recorded iterations
    # (the first's, whose serials are lowest), per iteration, before it is fitted to the iteration.
    per_iteration = len(operations) // iterations
    kernels_ms = sum((serial + 1) / 1000 for serial in range(per_iteration))
    attribution = breakdown.attribution
    assert attribution.operations_ms / attribution.scaled_by == pytest.approx(kernels_ms)


@pytest.mark.slow
def test_without_kernels_every_operation_keeps_its_span_and_the_document_says_why(tmp_path):
    result = recorded(tmp_path, STEPS, iterations=3, kernel_capture=NoKernels)
    recording, memory = result.iterations, result.memory
    operations = result.recording.operations
    assert all(op.span_ms is None and op.duration_ms > 0 for op in operations)
    breakdown = recording.breakdown(run_time_ms=10.0, peak_memory_bytes=memory.peak_bytes)
    assert breakdown.attribution.device_time == SPANS
    assert "recorded no kernels" in breakdown.attribution.device_time_fallback
    assert breakdown.to_dict()["attribution"]["device_time"] == SPANS


def test_a_trace_that_misses_an_operation_leaves_every_operation_its_span():
    from skyline_engine.attribute.recorder import OperationRecord, Recording

    recording = Recording()
    first = OperationRecord("mm", "forward", (), "", duration_ms=2.0)
    second = OperationRecord("relu", "forward", (), "", duration_ms=1.0)
    recording.operations = [first, second]
    recording.take_kernel_times({0: first}, {0: 0.5}, None)
    assert (first.duration_ms, first.span_ms, recording.device_time) == (0.5, 2.0, KERNELS)
    # A later capture's trace lacks one of its operations: back to spans for all, never a mix.
    recording.take_kernel_times({1: second, 2: first}, {1: 0.25}, None)
    assert [(op.duration_ms, op.span_ms) for op in (first, second)] == [(2.0, None), (1.0, None)]
    assert recording.device_time == SPANS
    assert recording.device_time_fallback == "torch.profiler's trace lacks 1 of 2 recorded operations"


@pytest.mark.filterwarnings("ignore:CUDA is not available")
def test_on_a_machine_without_cuda_the_capture_finds_no_kernels_and_says_so():
    """The real capture, CUDA activity asked for, on this machine without a GPU."""
    capture = KernelCapture()
    with capture:
        torch.randn(16, 16) @ torch.randn(16, 16)
    assert capture.kernel_ms is None
    assert "recorded no kernels" in capture.fallback
