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

Each block also counts the minor page faults the process took (`TimingStats.page_faults`): pages
the kernel maps in at first touch, as glibc's malloc hands large blocks back and takes them again.
A batch size's own training can take thousands an iteration where the same batch size, timed after
a larger one ran in the process, takes none (measure/allocator.py), so they tell whether two times
were taken in the state the user's training runs in.

The estimate is the mean time per iteration over the timed blocks: what a training log reports
(its total time over its iterations), so a number the user's own training reproduces. The lower
quartile, used before, read 6-18 % below plain training loops in fresh processes on a quiet
machine (the examples, a small GPT); a busy machine is met by interleaving, timing again where
the line bends, and saying so, not by an optimistic quantile.

Timing stops once every batch size has had at least `min_iterations` iterations and its blocks pin
its mean down to `target_relative_error` (its standard error), after a minimum time and number of
blocks, or at the time limit; the minimum number of blocks is timed even past the limit, so that a
slow iteration is never judged from one or two. Rounds timed to decide a comparison (`Decided`)
also stop once the estimates decide it, from MIN_DECIDING_BLOCKS blocks each on: the minimum
time and iterations are there to pin a mean down, and a comparison that is already decided does
not need them.
"""

from __future__ import annotations

import math
import resource
from collections.abc import Mapping
from dataclasses import dataclass
from time import perf_counter, perf_counter_ns  # bound now: user code may replace time's (freezegun)
from typing import Callable, Protocol

import numpy as np
import torch

Run = Callable[[], None]
# Whether the rounds so far decide what they are timed for, from each batch size's estimate and
# the relative standard error of its mean (BlockTimes.relative_error), by batch size.
Decided = Callable[[Mapping[int, "TimingStats"], Mapping[int, float]], bool]


class Clock(Protocol):
    def time_ms(self, run_block: Callable[[], None]) -> float:
        """Milliseconds `run_block` takes on the device."""
        ...


class CpuClock:
    """Wall-clock time of a block of iterations."""

    def time_ms(self, run_block: Callable[[], None]) -> float:
        start = perf_counter_ns()
        run_block()
        return (perf_counter_ns() - start) / 1e6


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


# Rounds timed to decide a comparison may stop once each batch size has this many blocks: the
# standard error of a mean of 3 blocks is itself too uncertain to decide by (Student's t with 2
# degrees of freedom exceeds 3 one time in 10; with 4, one in 25).
MIN_DECIDING_BLOCKS = 5

# Timed again (`InterleavedTiming.extend`), an estimate is made of the new blocks alone once there
# are this many of them.
MIN_WINDOW_BLOCKS = 3


@dataclass(frozen=True)
class TimingBudget:
    """How long to time a batch size.

    `warmup_iterations` run before anything is measured (the first creates an optimizer's state;
    on CUDA, at every batch size). Then stop timing when at least `min_run_s` has been spent, by
    all the batch sizes timed together, and at least `min_blocks` blocks and `min_iterations`
    iterations of each batch size, and each mean's standard error is within
    `target_relative_error` of it, or when `max_run_s` is spent (on all the batch sizes timed
    together: precision beyond the drift between processes buys nothing); but never before
    `min_blocks` blocks. (A 0.1 s minimum, down from 0.2 s, kept the held-out time errors of the
    examples within 4 %, with the malloc thresholds pinned. Held by each batch size on its own,
    the default example's models' rounds took 0.91 s, median of 5 processes, against 0.24 s held
    by the rounds together; replayed on the same rounds, where the two rules stop apart their
    lines 4 times past the largest batch size differ by 0.6-3.0 points, and both lie 2-15 % from
    the line through the same process's means over its next 3 s.) A 3 % standard
    error and 1 s at most: fresh processes of one training loop differ by 4-29 % here
    (bench/fidelity.md), and with 1.5 % and 2 s, which this machine's noise seldom let a mean reach,
    a cold analysis of the examples took 1.7-2.5 times as long as before the mean (2.2-2.9 s).
    """

    warmup_iterations: int = 1
    min_run_s: float = 0.1
    max_run_s: float = 1.0
    min_blocks: int = 3
    min_iterations: int = 10
    target_relative_error: float = 0.03
    min_block_ms: float = 5.0
    # What one memory-only probe may cost, in predicted iteration seconds (analysis/probing.py).
    memory_probe_s: float = 2.0


@dataclass(frozen=True)
class TimingStats:
    """The time of one iteration at one batch size: the mean over the timed iterations, the
    spread of the blocks' times per iteration (interquartile range), how many iterations and
    blocks were timed, and how well the blocks pin the mean down (`relative_error`: the standard
    error of their mean relative to it, inf from fewer than two blocks; 0 for a time given, not
    timed: a test's)."""

    run_time_ms: float
    iqr_ms: float
    iterations: int
    block_size: int
    relative_error: float = 0.0
    # Minor page faults an iteration, over the same blocks as the time (the process's: every
    # thread's); None where not counted (a time given, not timed).
    page_faults: float | None = None


def minor_page_faults() -> int:
    """The minor page faults this process has taken so far, every thread's (getrusage)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


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
        faults = minor_page_faults()
        first_ms = clock.time_ms(run)
        first_faults = minor_page_faults() - faults
        size = block_size or max(1, math.ceil(min_block_ms / max(first_ms, 1e-3)))
        self.block_size = math.ceil(size / cycle) * cycle
        # An iteration long enough to be its own block is already an observation; a shorter one
        # only sized the blocks.
        self.per_iteration: list[float] = [first_ms] if self.block_size == 1 else []
        self.faults_per_iteration: list[float] = [first_faults] if self.block_size == 1 else []
        self.spent_ms = first_ms
        # Where the blocks the estimate is made of start (`time_again`).
        self._window_start = 0

    def time_block(self) -> None:
        def block() -> None:
            for _ in range(self.block_size):
                self.run()

        faults = minor_page_faults()
        block_ms = self.clock.time_ms(block)
        self.faults_per_iteration.append((minor_page_faults() - faults) / self.block_size)
        self.spent_ms += block_ms
        self.per_iteration.append(block_ms / self.block_size)

    @property
    def iterations(self) -> int:
        return len(self.per_iteration) * self.block_size

    def time_again(self) -> None:
        """From now on the estimate is made of the blocks timed from here (once there are at
        least MIN_WINDOW_BLOCKS of them): the earlier ones met a burst of load that bent the line."""
        self._window_start = len(self.per_iteration)

    @property
    def window(self) -> list[float]:
        """The blocks' times per iteration that the estimate is made of."""
        return self._windowed(self.per_iteration)

    def _windowed(self, values: list[float]) -> list[float]:
        """The part of `values` (one per block, as `per_iteration`) the estimate is made of."""
        recent = values[self._window_start :]
        return recent if len(recent) >= MIN_WINDOW_BLOCKS else values

    def relative_error(self) -> float:
        """How well the blocks pin the mean iteration's time down: the standard error of their
        mean relative to it, σ / √n."""
        values = self.window
        if len(values) < 2:
            return math.inf
        mean = float(np.mean(values))
        if mean <= 0:
            return 0.0
        return float(np.std(values, ddof=1) / np.sqrt(len(values)) / mean)

    def stats(self) -> TimingStats:
        window = self.window
        q1, q3 = np.percentile(window, [25, 75])
        # Every block runs `block_size` iterations: the mean of their times per iteration is the
        # total time over the iterations.
        iterations = len(window) * self.block_size
        faults = float(np.mean(self._windowed(self.faults_per_iteration)))
        return TimingStats(
            float(np.mean(window)), float(q3 - q1), iterations, self.block_size, self.relative_error(), faults
        )


class InterleavedTiming:
    """Batch sizes timed together, one block of each per round, each round starting one later."""

    def __init__(self, runs: Mapping[int, Run], clock: Clock, budget: TimingBudget, cycle: int = 1) -> None:
        self.budget = budget
        self.times = {
            batch_size: BlockTimes(run, clock, budget.min_block_ms, cycle=cycle) for batch_size, run in runs.items()
        }
        self._rounds = 0

    def measure(self, max_s: float, decided: Decided | None = None) -> None:
        """Rounds until every batch size is precise (after the budget's minimum time and blocks
        each), or the estimates decide what they are timed for (`decided`, from
        MIN_DECIDING_BLOCKS blocks each on), or until `max_s` more seconds are spent. Every batch
        size takes part in every round, even once it is precise itself: one that sat out while the
        machine got busier would keep its quieter time while the others take the busier one, and
        the line through them would bend (tests/test_timing.py)."""
        started = perf_counter()
        while (perf_counter() - started < max_s and not self.precise() and not self._decided(decided)) or (
            not self.enough_blocks()
        ):
            self.round()

    def _decided(self, decided: Decided | None) -> bool:
        if decided is None or any(len(t.per_iteration) < MIN_DECIDING_BLOCKS for t in self.times.values()):
            return False
        return decided(self.stats(), {batch_size: t.relative_error() for batch_size, t in self.times.items()})

    def extend(self, max_s: float) -> None:
        """As many rounds again as so far, or until `max_s` is spent, the estimates made of them
        alone: when the estimates, precise one by one, do not make a straight line together, a
        burst of load bent it (it hit one batch size's blocks more than the others'), and the
        means would keep it."""
        for times in self.times.values():
            times.time_again()
        started = perf_counter()
        for _ in range(self._rounds):
            if perf_counter() - started >= max_s:
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
        # The minimum time is the rounds', not each batch size's own: every batch size's blocks
        # are spread over all of it (TimingBudget).
        spent_ms = sum(t.spent_ms for t in self.times.values())
        return spent_ms >= self.budget.min_run_s * 1000 and all(self._precise(t) for t in self.times.values())

    def enough_blocks(self) -> bool:
        """Whether every batch size has its minimum number of blocks, timed whatever the limit."""
        return all(len(t.per_iteration) >= self.budget.min_blocks for t in self.times.values())

    def _precise(self, times: BlockTimes) -> bool:
        return (
            len(times.per_iteration) >= self.budget.min_blocks
            and times.iterations >= self.budget.min_iterations
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
