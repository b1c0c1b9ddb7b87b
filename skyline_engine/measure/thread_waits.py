"""Whether PyTorch's CPU threads waited a scheduler slice at every parallel region.

PyTorch runs a CPU kernel's parallel region on OpenMP threads (libgomp on Linux). A thread that
finishes its part first spins before it sleeps (OpenMP's waiting, GOMP_SPINCOUNT); where the
spinning thread holds the core that the thread it waits for needs, the region ends only when the
spin does or the scheduler switches them. Measured on 2 cores, the default example's own loop in
fresh processes: with its two threads held on one core (pinned after they started), each parallel
region of 131,072 additions took 8-12 ms against 8 µs, the optimizer step 120-180 ms against 1 ms,
forward and backward 190-290 ms against 6 ms. Under two busy processes, unpinned, 3 of 8 fresh
processes of that loop ran like this for their whole life (the kernel balances cores by count, and
two tasks a core is balanced), the others normally. On one core, OMP_WAIT_POLICY=passive took the
step back to 1.4-1.9 ms and GOMP_SPINCOUNT=10000 (--settle-runtime) to 16 ms; on a quiet machine
passive waiting cost the examples' iterations 5-80 %.

An analysis measures the process it runs in, so its times and its lines' shares are then those of
this state: the probe says so. It runs a few parallel regions of one grain of work per thread (no
region smaller is split) right after the user's batch size was timed, and, in an entry point's
analysis, again after the other batch sizes' rounds (the state can begin later in a process):
microseconds in all, or a slice each in this state.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from time import perf_counter_ns  # bound now: user code may replace time's (freezegun)

import torch

# at::internal::GRAIN_SIZE: the elements per thread below which a kernel does not split its work.
GRAIN = 32_768
PROBES = 15
# A parallel region this long (the median of the probes) waited for the scheduler: a grain of
# additions per thread takes microseconds, a wait a slice (8-12 ms here; less on other kernels).
SLICE_WAIT_MS = 1.0


@dataclass(frozen=True)
class ThreadWaits:
    """The parallel regions' median time (`region_ms`) on `threads` threads, where they waited."""

    region_ms: float
    threads: int

    def warning(self) -> str:
        return (
            f"Your {self.threads} CPU threads waited for a core at every parallel operation: a parallel addition of "
            f"{GRAIN * self.threads:,} numbers, timed after your iterations, took {self.region_ms:.1f} ms, where it "
            "takes microseconds. PyTorch's OpenMP threads spin while they wait for each other, and with "
            "other processes on the cores the spinning thread held the core the other needed; a training process "
            "can run this way for its whole life (here the default example's loop, 3 of 8 fresh processes beside "
            "two busy ones, 40 times slower). These times and shares are of that state. OMP_WAIT_POLICY=passive, "
            "set before torch is imported, avoids it (at a cost on an idle machine: 5-80 % here); so do fewer "
            "threads (torch.set_num_threads) on a shared machine."
        )


def thread_waits(device: torch.device) -> ThreadWaits | None:
    """The parallel regions' wait on `device`'s CPU threads, as this thread runs them; None where
    they did not wait (or nothing runs in parallel: one thread, a GPU)."""
    threads = torch.get_num_threads()
    if device.type != "cpu" or threads < 2:
        return None
    return waits_of(_region_times(threads), threads)


def waits_of(region_ms: list[float], threads: int) -> ThreadWaits | None:
    """`region_ms`, the probes' times, as waits: their median from SLICE_WAIT_MS, else None."""
    median = statistics.median(region_ms)
    return ThreadWaits(median, threads) if median >= SLICE_WAIT_MS else None


def _region_times(threads: int) -> list[float]:
    work = torch.zeros(GRAIN * threads, dtype=torch.float32, device="cpu")  # whatever the defaults
    times = []
    for _ in range(PROBES):
        start = perf_counter_ns()
        work.add_(1.0)
        times.append((perf_counter_ns() - start) / 1e6)
    return times
