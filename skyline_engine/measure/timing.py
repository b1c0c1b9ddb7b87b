"""Timing iterations: a device clock, and blocks of iterations timed in interleaved rounds until
the estimate is stable.

The scheme follows `torch.utils.benchmark.Timer.blocked_autorange`: iterations are timed in blocks
(several iterations per block when one is too short to time well), blocks are collected until a
minimum time has passed, and a block's time per iteration is one observation. Two things are ours,
for a shared machine:

- Several batch sizes are timed together, one block of each per round, each round starting with
  another one: a burst of load, or a change of clock frequency, hits all of them alike instead of
  bending one (measured on the CNN example under two busy processes: R² of the time line 0.99 and
  held-out errors 2-10 % interleaved, against 7-17 % timing one batch size after another).
- The estimate is the lower quartile of the observations, not their median: interference only
  adds time, and the median of blocks on a busy machine swings with it (held-out errors 18-27 %
  with the median of the same interleaved blocks). On a quiet machine the two agree within noise.

Timing stops once every batch size's blocks pin its time down to `target_relative_error` (the
standard error of their median, from the interquartile range), after a minimum time and number of
blocks, or at the time limit.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Callable, Protocol

import numpy as np
import torch

Run = Callable[[], None]

# The estimate of an iteration's time: this percentile of the observations (see the docstring).
ESTIMATE_PERCENTILE = 25
# Standard error of a sample's median, in standard deviations times sqrt(n), for normal noise:
# sqrt(pi / 2).
_MEDIAN_ERROR = 1.2533


class Clock(Protocol):
    def time_ms(self, run_block: Callable[[], None]) -> float:
        """Milliseconds `run_block` takes on the device."""
        ...


class CpuClock:
    """Wall-clock time of a block of iterations."""

    def time_ms(self, run_block: Callable[[], None]) -> float:
        start = time.perf_counter_ns()
        run_block()
        return (time.perf_counter_ns() - start) / 1e6


class CudaClock:
    """Device time of a block of iterations, between two CUDA events, after synchronising.

    Synchronising first keeps earlier queued work out of the block; synchronising on the end
    event makes the block's device work complete before it is read.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def time_ms(self, run_block: Callable[[], None]) -> float:
        torch.cuda.synchronize(self.device)
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        run_block()
        end.record()
        end.synchronize()
        return float(start.elapsed_time(end))


def clock_for(device: torch.device) -> Clock:
    return CudaClock(device) if device.type == "cuda" else CpuClock()


@dataclass(frozen=True)
class TimingBudget:
    """How long to time a batch size.

    `warmup_iterations` run before anything is measured (the first creates an optimizer's state;
    on CUDA, at every batch size). Then stop timing when at least `min_run_s` has been spent on at
    least `min_blocks` blocks of each batch size and each estimate's standard error is within
    `target_relative_error` of it, or when `max_run_s` is spent (on all the batch sizes timed
    together: precision beyond the drift between processes buys nothing). (A 0.1 s minimum,
    down from 0.2 s, kept the held-out time errors of the examples within 4 %, with the malloc
    thresholds pinned.)
    """

    warmup_iterations: int = 1
    min_run_s: float = 0.1
    max_run_s: float = 2.0
    min_blocks: int = 3
    target_relative_error: float = 0.015
    min_block_ms: float = 5.0
    # What one memory-only probe may cost, in predicted iteration seconds (analysis/probing.py).
    memory_probe_s: float = 2.0


@dataclass(frozen=True)
class TimingStats:
    """The time of one iteration at one batch size: the estimate (see ESTIMATE_PERCENTILE), the
    spread of the observations, and how many iterations and blocks were timed."""

    run_time_ms: float
    iqr_ms: float
    iterations: int
    block_size: int


class BlockTimes:
    """The observations of one batch size: blocks of `block_size` iterations, per iteration."""

    def __init__(
        self, run: Run, clock: Clock, min_block_ms: float, block_size: int | None = None, cycle: int = 1
    ) -> None:
        """`block_size`, when given, instead of the one the first iteration's time implies: ranks
        of distributed training must run the same number of iterations (measure/distributed.py).
        `cycle`: iterations whose calls differ in a cycle of this many calls are timed in blocks
        of whole cycles (measure/work_per_call.py)."""
        self.run = run
        self.clock = clock
        first_ms = clock.time_ms(run)
        size = block_size or max(1, math.ceil(min_block_ms / max(first_ms, 1e-3)))
        self.block_size = math.ceil(size / cycle) * cycle
        # An iteration long enough to be its own block is already an observation; a shorter one
        # only sized the blocks.
        self.per_iteration: list[float] = [first_ms] if self.block_size == 1 else []
        self.spent_ms = first_ms

    def time_block(self) -> None:
        def block() -> None:
            for _ in range(self.block_size):
                self.run()

        block_ms = self.clock.time_ms(block)
        self.spent_ms += block_ms
        self.per_iteration.append(block_ms / self.block_size)

    def relative_error(self) -> float:
        """How well the blocks pin the iteration's time down: the standard error of their median
        relative to it, 1.2533 σ / √n with σ robustly IQR / 1.349. (The lower quartile has about
        the same standard error; relative to the median, as before the estimate changed, a
        right-skewed spread of blocks does not call for several times more of them.)"""
        values = self.per_iteration
        if len(values) < 2:
            return math.inf
        q1, median, q3 = np.percentile(values, [25, 50, 75])
        if median <= 0:
            return 0.0
        return float(_MEDIAN_ERROR * (q3 - q1) / 1.349 / np.sqrt(len(values)) / median)

    def stats(self) -> TimingStats:
        q1, estimate, q3 = np.percentile(self.per_iteration, [25, ESTIMATE_PERCENTILE, 75])
        return TimingStats(float(estimate), float(q3 - q1), len(self.per_iteration) * self.block_size, self.block_size)


class InterleavedTiming:
    """Batch sizes timed together, one block of each per round, each round starting one later."""

    def __init__(self, runs: Mapping[int, Run], clock: Clock, budget: TimingBudget, cycle: int = 1) -> None:
        self.budget = budget
        self.times = {
            batch_size: BlockTimes(run, clock, budget.min_block_ms, cycle=cycle) for batch_size, run in runs.items()
        }
        self._rounds = 0

    def measure(self, max_s: float) -> None:
        """Rounds until every batch size is precise (after the budget's minimum time and blocks
        each), or until `max_s` more seconds are spent. Every batch size takes part in every
        round, even once it is precise itself: one that sat out while the machine got busier
        would keep its quieter time while the others take the busier one, and the line through
        them would bend (tests/test_timing.py)."""
        started = time.perf_counter()
        while time.perf_counter() - started < max_s and not self.precise():
            self.round()

    def extend(self, max_s: float) -> None:
        """As many rounds again as so far, or until `max_s` is spent: when the estimates, precise
        one by one, do not make a straight line together."""
        started = time.perf_counter()
        for _ in range(self._rounds):
            if time.perf_counter() - started >= max_s:
                return
            self.round()

    def round(self) -> None:
        """One block of each batch size, starting one later than the previous round started."""
        order = list(self.times)
        shift = self._rounds % len(order)
        for batch_size in order[shift:] + order[:shift]:
            self.times[batch_size].time_block()
        self._rounds += 1

    def precise(self) -> bool:
        return all(self._precise(t) for t in self.times.values())

    def _precise(self, times: BlockTimes) -> bool:
        return (
            times.spent_ms >= self.budget.min_run_s * 1000
            and len(times.per_iteration) >= self.budget.min_blocks
            and times.relative_error() <= self.budget.target_relative_error
        )

    def stats(self) -> dict[int, TimingStats]:
        return {batch_size: t.stats() for batch_size, t in self.times.items()}


def measure_iteration_time(run_once: Run, clock: Clock, budget: TimingBudget, cycle: int = 1) -> TimingStats:
    """The time of one iteration of `run_once`, timed in blocks (of whole cycles of `cycle` calls)
    until stable (see the module docstring). Assumes warm-up is done."""
    timing = InterleavedTiming({0: run_once}, clock, budget, cycle=cycle)
    timing.measure(budget.max_run_s)
    return timing.stats()[0]
