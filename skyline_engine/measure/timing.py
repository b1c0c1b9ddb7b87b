"""Timing an iteration: a device clock, and adaptive repetitions until the estimate is stable.

The repetition scheme follows `torch.utils.benchmark.Timer.blocked_autorange`: iterations are timed
in blocks (several iterations per block when one is too short to time well), blocks are collected
until a minimum time has passed, and the median per-iteration time is reported with its
interquartile range. We add a stop on precision: once the median is known to within
`target_relative_error` (its standard error, estimated from the interquartile range), more blocks
would not change the answer, however noisy single blocks are.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Protocol

import numpy as np
import torch


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
    """How long to time one batch size.

    `warmup_iterations` run before anything is measured (the first creates an optimizer's state;
    on CUDA, at every batch size). Then stop timing when at least `min_run_s` has been spent on at
    least `min_blocks` blocks and the median's standard error is within `target_relative_error`
    of it, or when `max_run_s` is spent. (A 0.1 s minimum, down from 0.2 s, kept the held-out
    time errors of the examples within 4 %, with the malloc thresholds pinned.)
    """

    warmup_iterations: int = 1
    min_run_s: float = 0.1
    max_run_s: float = 2.0
    min_blocks: int = 3
    target_relative_error: float = 0.015
    min_block_ms: float = 5.0


@dataclass(frozen=True)
class TimingStats:
    median_ms: float
    iqr_ms: float
    iterations: int
    block_size: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "median_ms": self.median_ms,
            "iqr_ms": self.iqr_ms,
            "iterations": self.iterations,
            "block_size": self.block_size,
        }


def measure_iteration_time(run_once: Callable[[], None], clock: Clock, budget: TimingBudget) -> TimingStats:
    """Median time of one iteration, timed in blocks until stable. Assumes warm-up is done."""
    first_ms = clock.time_ms(run_once)
    block_size = max(1, int(np.ceil(budget.min_block_ms / max(first_ms, 1e-3))))

    def run_block() -> None:
        for _ in range(block_size):
            run_once()

    # An iteration long enough to be its own block is already a sample; a shorter one only sized
    # the blocks.
    per_iteration: list[float] = [first_ms] if block_size == 1 else []
    spent_ms = first_ms
    while True:
        block_ms = clock.time_ms(run_block)
        spent_ms += block_ms
        per_iteration.append(block_ms / block_size)
        if len(per_iteration) < budget.min_blocks:
            continue
        if spent_ms >= budget.max_run_s * 1000:
            break
        if (
            spent_ms >= budget.min_run_s * 1000
            and _median_relative_error(per_iteration) <= budget.target_relative_error
        ):
            break
    q1, median, q3 = np.percentile(per_iteration, [25, 50, 75])
    return TimingStats(float(median), float(q3 - q1), len(per_iteration) * block_size, block_size)


def _median_relative_error(values: list[float]) -> float:
    """Standard error of the sample median relative to it: sqrt(pi/2) * sigma / sqrt(n), with sigma
    estimated robustly as IQR / 1.349 (exact for normal noise, conservative for heavier tails)."""
    q1, median, q3 = np.percentile(values, [25, 50, 75])
    if median <= 0:
        return 0.0
    sigma = (q3 - q1) / 1.349
    return float(1.2533 * sigma / np.sqrt(len(values)) / median)
