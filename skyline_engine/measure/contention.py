"""How busy the rest of the machine kept the CPUs while we were measuring.

Timing on a shared machine measures the machine as much as the model: under two busy processes
on two cores, one CNN iteration took 7 times as long, with single blocks 50 times the quiet time.
The kernel's counters say how much CPU time every process used (/proc/stat) and how much ours did
(os.times, all of its threads): the difference, over the wall time and the CPUs, is the share of
the machine others took. Linux only; elsewhere nothing is said.
"""

from __future__ import annotations

import os
from time import monotonic  # bound now: user code may replace time's (freezegun)

# From this share of the CPUs kept busy by other processes, the machine counts as busy: a warning
# says so where batch sizes were timed, and more iterations are recorded for the breakdown.
BUSY_MACHINE = 0.25


class CpuContention:
    """Use as `with CpuContention() as contention:` around a measurement; then `others_share` is
    the share of all CPUs that other processes kept busy meanwhile (0 to 1), or None where the
    counters cannot be read."""

    def __init__(self, stat_path: str = "/proc/stat") -> None:
        self._stat_path = stat_path
        self.others_share: float | None = None
        self._start: tuple[float, float, int] | None = None

    def __enter__(self) -> CpuContention:
        self._start = self._now()
        return self

    def __exit__(self, *exc: object) -> None:
        end = self._now()
        if self._start is None or end[2] < 0 or self._start[2] < 0:
            return
        wall, ours, busy = (b - a for a, b in zip(self._start, end))
        capacity = wall * (os.cpu_count() or 1)
        if capacity > 0:
            self.others_share = min(1.0, max(0.0, (busy / os.sysconf("SC_CLK_TCK") - ours) / capacity))

    @property
    def busy(self) -> bool:
        """Whether other processes kept at least BUSY_MACHINE of the CPUs busy meanwhile."""
        return self.others_share is not None and self.others_share >= BUSY_MACHINE

    def _now(self) -> tuple[float, float, int]:
        """(wall seconds, our CPU seconds, every process's busy ticks or -1)."""
        times = os.times()
        return monotonic(), times.user + times.system, self._busy_ticks()

    def _busy_ticks(self) -> int:
        try:
            with open(self._stat_path, encoding="ascii") as f:
                fields = f.readline().split()
        except OSError:
            return -1
        if not fields or fields[0] != "cpu":
            return -1
        # user nice system idle iowait irq softirq steal: all but idle and iowait are busy
        ticks = [int(value) for value in fields[1:9]]
        return sum(ticks) - ticks[3] - ticks[4]


def busiest(*readings: CpuContention | None) -> CpuContention | None:
    """Of `readings` (None: not taken), the one whose other processes took the largest share of the
    CPUs; None where no counters could be read."""
    read = [r for r in readings if r is not None and r.others_share is not None]
    return max(read, key=lambda r: r.others_share or 0.0, default=None)
