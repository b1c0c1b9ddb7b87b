"""On CUDA, each recorded operation's kernel time: the device time of the kernels it launched.

CUDA events around an operation time its span on the stream, which follows the host's launches
as much as the kernels: on an H200 the CNN example's `convolution_backward` took 13 % of the
recorded spans against 35 % of its kernels' time in torch.profiler, and the spans summed to 2 to
3.4 times the iteration. A line's time on a GPU should be its kernels' time.

So the recorded iterations run under torch.profiler (Kineto, with CUPTI's kernel activity), and
the recorder wraps each operation in a range named `skyline#<serial>` (`range_name`). Kineto
correlates each kernel (and each copy or fill on the device) with the runtime call that launched
it (`args.correlation`); that call ran on a host thread inside one of the ranges: the kernel's
time is that operation's. Backward operations run on autograd's device thread, whose ranges
are on that thread: the range is found on the launch's own thread.

`kernel_ms_by_operation` reads the events of Kineto's trace (its Chrome-trace JSON, the
`traceEvents`), the one narrow seam between the GPU and the rest: tests on a machine without one
feed it events written in Kineto's format. `KernelCapture` is the profiler around the recorded
iterations; where it cannot start or CUPTI records no kernel (permissions, an old driver, another
profiler already running), the spans stay and `fallback` says why.
"""

from __future__ import annotations

import bisect
import json
import os
import tempfile
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

RANGE_PREFIX = "skyline#"
# Kineto's categories: what ran on the device, and the host calls that launched it.
_DEVICE_WORK = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
_LAUNCHES = frozenset({"cuda_runtime", "cuda_driver"})
_RANGES = "user_annotation"  # a record_function range on a host thread (its device twin is gpu_user_annotation)

# `attribution.device_time`: what an operation's time is on a GPU; on a busy CPU, the CPU time of
# the thread that ran it (attribute/breakdown.py, `_per_iteration`), and on a quiet one (None) its
# wall time.
KERNELS = "kernels"
SPANS = "spans"
THREAD_CPU = "thread_cpu"


def range_name(serial: int) -> str:
    return f"{RANGE_PREFIX}{serial}"


def kernel_ms_by_operation(events: Iterable[Mapping[str, Any]]) -> dict[int, float]:
    """The device time (ms) of the kernels, copies and fills each `skyline#<serial>` range
    launched, by serial: every range found, 0.0 where it launched nothing. A kernel whose launch
    lies in no range (the profiler's own work, an operation not recorded) counts for none."""
    ranges: dict[tuple[Any, Any], list[tuple[float, float, int]]] = defaultdict(list)
    launches: list[tuple[tuple[Any, Any], float, Any]] = []
    device_us: dict[Any, float] = defaultdict(float)
    for event in events:
        category, args = event.get("cat"), event.get("args") or {}
        if category == _RANGES and str(event.get("name", "")).startswith(RANGE_PREFIX):
            serial = _serial(event["name"])
            if serial is not None:
                start = float(event["ts"])
                ranges[(event.get("pid"), event.get("tid"))].append((start, start + float(event["dur"]), serial))
        elif category in _LAUNCHES and "correlation" in args:
            launches.append(((event.get("pid"), event.get("tid")), float(event["ts"]), args["correlation"]))
        elif category in _DEVICE_WORK and "correlation" in args:
            device_us[args["correlation"]] += float(event.get("dur", 0.0))
    for spans in ranges.values():
        spans.sort()
    starts = {thread: [start for start, _, _ in spans] for thread, spans in ranges.items()}
    by_serial = {serial: 0.0 for spans in ranges.values() for _, _, serial in spans}
    for thread, at, correlation in launches:
        serial = _range_at(ranges.get(thread, []), starts.get(thread, []), at)
        if serial is not None:
            by_serial[serial] += device_us.get(correlation, 0.0) / 1000.0
    return by_serial


def has_device_work(events: Iterable[Mapping[str, Any]]) -> bool:
    return any(event.get("cat") in _DEVICE_WORK for event in events)


def _serial(name: str) -> int | None:
    digits = name[len(RANGE_PREFIX) :]
    return int(digits) if digits.isdigit() else None


def _range_at(spans: list[tuple[float, float, int]], starts: list[float], at: float) -> int | None:
    """The range that holds the moment `at` on its thread: ranges do not nest (the recorder's
    dispatch mode sees no operation inside another), so the last one to start before it."""
    index = bisect.bisect_right(starts, at) - 1
    if index < 0:
        return None
    start, end, serial = spans[index]
    return serial if start <= at <= end else None


class KernelCapture:
    """torch.profiler with CUDA activity around recorded iterations; `kernel_ms` afterwards (None
    and `fallback` set where no kernel time could be had)."""

    def __init__(self) -> None:
        self.fallback: str | None = None
        self.kernel_ms: dict[int, float] | None = None
        self._profiler: Any = None

    def activities(self) -> list[Any]:
        from torch.profiler import ProfilerActivity

        return [ProfilerActivity.CPU, ProfilerActivity.CUDA]

    def trace_events(self, profiler: Any) -> list[dict[str, Any]]:
        """The events of Kineto's trace, through the Chrome-trace JSON torch.profiler writes."""
        handle, path = tempfile.mkstemp(prefix="skyline-kernels-", suffix=".json")
        os.close(handle)
        try:
            profiler.export_chrome_trace(path)
            with open(path, encoding="utf-8") as trace:
                return list(json.load(trace).get("traceEvents", []))
        finally:
            os.unlink(path)

    def __enter__(self) -> KernelCapture:
        from torch.profiler import profile

        try:
            self._profiler = profile(activities=self.activities())
            self._profiler.__enter__()
        except Exception as exc:  # noqa: BLE001 - any failure to start leaves the spans, said why
            self._profiler = None
            self.fallback = f"torch.profiler could not start ({type(exc).__name__}: {exc})"
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._profiler is None:
            return
        try:
            self._profiler.__exit__(*exc)
            events = self.trace_events(self._profiler)
        except Exception as error:  # noqa: BLE001 - as above
            self.fallback = f"torch.profiler's trace could not be read ({type(error).__name__}: {error})"
            return
        finally:
            self._profiler = None
        if not has_device_work(events):
            self.fallback = "torch.profiler recorded no kernels (CUPTI unavailable: permissions or the driver)"
            return
        self.kernel_ms = kernel_ms_by_operation(events)
