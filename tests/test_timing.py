"""Timing with an injected clock: iterations whose true times are written here, disturbed by load
as a busy machine disturbs them. No real time is measured, so these hold on any machine."""

from __future__ import annotations

import dataclasses
import itertools
import math
import mmap

import pytest

from skyline_engine.analysis.session import remeasure_while_poor_fit
from skyline_engine.measure.contention import CpuContention
from skyline_engine.measure.timing import (
    MIN_DECIDING_BLOCKS,
    CpuClock,
    InterleavedTiming,
    TimingBudget,
    measure_iteration_time,
)
from skyline_engine.predict.linear import fit_line

SLOPE, BIAS = 0.5, 2.0  # ms a sample, ms an iteration
SIZES = (16, 32, 64)
# The precision the interleaving tests were written at: enough rounds that one round with the load
# changing midway moves no mean more than 1 %.
BUDGET = TimingBudget(min_run_s=0.05, max_run_s=2.0, min_block_ms=5.0, target_relative_error=0.015)


class LoadedClock:
    """Times a block as its iterations' true times, each multiplied by the load of the moment:
    `load(n)` for the n-th block timed (the machine's load changes with time, not per batch size)."""

    def __init__(self, load):
        self.load = load
        self.blocks = 0
        self.ran: list[int] = []

    def time_ms(self, run_block) -> float:
        self.ran.clear()
        run_block()
        factor = self.load(self.blocks)
        self.blocks += 1
        return sum(SLOPE * b + BIAS for b in self.ran) * factor


def runs(clock):
    return {b: (lambda b=b: clock.ran.append(b)) for b in SIZES}


def bursts(n):
    """Every fourth block hit by a burst of load that makes it 20 times slower."""
    return 20.0 if n % 4 == 3 else 1.0


def test_the_mean_counts_bursts_of_load_as_a_training_run_would_and_the_line_keeps_its_shape():
    """Every fourth block 20 times slower: the estimate is the mean iteration, as a training log
    reports it (5.75 times the quiet time), the same share for every batch size, since each sees
    the bursts alike in interleaved rounds."""
    clock = LoadedClock(bursts)
    timing = InterleavedTiming(runs(clock), clock, BUDGET)
    timing.measure(max_s=5.0)
    stats = timing.stats()
    for b in SIZES:
        assert stats[b].run_time_ms == pytest.approx((SLOPE * b + BIAS) * (3 * 1.0 + 20.0) / 4, rel=0.02)
    line = fit_line(list(stats), [s.run_time_ms for s in stats.values()])
    assert line.r2 > 0.999


def test_a_slow_iteration_gets_its_minimum_of_blocks_past_the_time_limit():
    """A 700 ms iteration was timed twice ("lower quartile of 2 timed"): the minimum number of
    blocks is timed whatever the limit, and each block is one iteration."""
    clock = LoadedClock(lambda n: 1.0)
    slow = {1400: (lambda: clock.ran.append(1400))}  # 0.5 ms a sample: 702 ms an iteration
    timing = InterleavedTiming(slow, clock, BUDGET)
    timing.measure(max_s=0.0)
    [stats] = timing.stats().values()
    assert stats.block_size == 1
    assert stats.iterations == BUDGET.min_blocks


def test_a_fast_iteration_is_timed_at_least_its_minimum_of_iterations():
    clock = LoadedClock(lambda n: 1.0)  # no noise: precise at once but for the count
    timing = InterleavedTiming({64: runs(clock)[64]}, clock, TimingBudget(min_run_s=0.0, min_block_ms=0.0))
    timing.measure(max_s=5.0)
    assert timing.stats()[64].iterations == TimingBudget().min_iterations


def test_interleaving_keeps_the_line_straight_when_the_load_changes_midway():
    """The machine gets busy (3 times slower) after a while. Timed one batch size after another,
    the last ones see only the busy machine and the line bends; timed in interleaved rounds, every
    batch size sees the same mix and the line stays straight (its level is the machine's)."""

    def getting_busy(n):
        return 1.0 if n < 8 else 3.0

    # Few iterations each, so that the first batch size timed alone finishes while it is quiet.
    budget = dataclasses.replace(BUDGET, min_iterations=3)

    clock = LoadedClock(getting_busy)
    sequential = {b: measure_iteration_time(runs(clock)[b], clock, budget).run_time_ms for b in SIZES}
    bent = fit_line(list(sequential), list(sequential.values()))

    clock = LoadedClock(getting_busy)
    timing = InterleavedTiming(runs(clock), clock, budget)
    timing.measure(max_s=5.0)
    interleaved = {b: s.run_time_ms for b, s in timing.stats().items()}
    straight = fit_line(list(interleaved), list(interleaved.values()))

    ratios = [interleaved[b] / (SLOPE * b + BIAS) for b in SIZES]
    assert max(ratios) == pytest.approx(min(ratios), rel=0.01)  # one factor for all: the line's shape holds
    assert straight.r2 > 0.999
    assert bent.r2 < 0.99 and bent.bias < 0  # one after another, the line bent (16 quiet, 32 and 64 busy)


def test_rounds_start_with_each_batch_size_in_turn():
    clock = LoadedClock(lambda n: 1.0)
    order: list[int] = []
    timed = {b: (lambda b=b: (clock.ran.append(b), order.append(b))) for b in SIZES}
    timing = InterleavedTiming(timed, clock, BUDGET)
    order.clear()
    for _ in range(3):
        timing.round()
    firsts = [order[i] for i in itertools.accumulate([0] + [len(order) // 3] * 2)]
    assert firsts == [16, 32, 64]


def test_extending_times_as_many_rounds_again():
    clock = LoadedClock(lambda n: 1.0)
    timing = InterleavedTiming(runs(clock), clock, BUDGET)
    timing.measure(max_s=5.0)
    before = {b: len(t.per_iteration) for b, t in timing.times.items()}
    timing.extend(max_s=5.0)
    for b, t in timing.times.items():
        assert len(t.per_iteration) == before[b] + (before[b] - (1 if t.block_size == 1 else 0))


def test_timing_stops_once_precise_and_not_before_its_minimum():
    clock = LoadedClock(lambda n: 1.0)  # no noise at all: precise at once
    timing = InterleavedTiming(runs(clock), clock, BUDGET)
    timing.measure(max_s=5.0)
    for stats in timing.stats().values():
        assert stats.iqr_ms == pytest.approx(0.0)
        # min_blocks blocks and min_iterations iterations (the rounds' min_run_s passed in the
        # first of them), then no more rounds than that needed
        needed = max(BUDGET.min_blocks * stats.block_size, BUDGET.min_iterations)
        assert needed <= stats.iterations < needed + 2 * stats.block_size


def test_the_minimum_time_is_the_rounds_not_each_batch_sizes_own():
    # Each batch size's blocks are spread over all the rounds' time: once the rounds have spent
    # the minimum together, the smallest batch size needs none of its own (16's 10 ms iterations
    # would have needed 100 rounds of their own for 1 s; 17 rounds of all three spend it).
    clock = LoadedClock(lambda n: 1.0)  # no noise at all: precise at once
    budget = dataclasses.replace(BUDGET, min_run_s=1.0, min_iterations=3)
    timing = InterleavedTiming(runs(clock), clock, budget)
    timing.measure(max_s=5.0)
    spent = sum(t.spent_ms for t in timing.times.values())
    round_ms = sum(SLOPE * b + BIAS for b in SIZES)  # a block is one iteration at these times
    assert budget.min_run_s * 1000 <= spent < budget.min_run_s * 1000 + round_ms
    assert {len(t.per_iteration) for t in timing.times.values()} == {math.ceil(1000 / round_ms)}


def noisy(n):
    """Alternate blocks 30 % slower: never precise within the budget's 1.5 %."""
    return 1.3 if n % 2 else 1.0


def test_rounds_stop_once_the_comparison_is_decided_and_not_before_its_blocks():
    clock = LoadedClock(noisy)
    timing = InterleavedTiming(runs(clock), clock, BUDGET)
    asked = []

    def decided(stats, errors):
        asked.append({b: len(t.per_iteration) for b, t in timing.times.items()})
        assert set(stats) == set(errors) == set(SIZES) and all(0 < e < math.inf for e in errors.values())
        return True

    timing.measure(max_s=5.0, decided=decided)
    # Asked once, when every batch size had its deciding blocks, and the rounds ended there, short
    # of the budget's 10 iterations each that a precise estimate waits for.
    assert asked == [dict.fromkeys(SIZES, MIN_DECIDING_BLOCKS)]
    assert all(len(t.per_iteration) == MIN_DECIDING_BLOCKS for t in timing.times.values())


def test_rounds_go_on_while_the_comparison_is_undecided():
    clock = LoadedClock(noisy)
    timing = InterleavedTiming(runs(clock), clock, BUDGET)
    verdicts = iter([False, False, True])
    timing.measure(max_s=5.0, decided=lambda stats, errors: next(verdicts))
    assert all(len(t.per_iteration) == MIN_DECIDING_BLOCKS + 2 for t in timing.times.values())


def write_stat(path, busy_ticks):
    # cpu user nice system idle iowait irq softirq steal guest guest_nice
    path.write_text(f"cpu  {busy_ticks} 0 0 1000 0 0 0 0 0 0\ncpu0 0 0 0 0 0 0 0 0 0 0\n")


class ChangingStat(CpuContention):
    """The kernel's counters, as a file that other processes' work advances meanwhile; and the
    clocks, injected: `wall_s` pass while this process uses no CPU of its own."""

    def __init__(self, path, ticks_meanwhile, wall_s):
        super().__init__(str(path))
        self.path, self.ticks_meanwhile = path, ticks_meanwhile
        self._clocks = iter([(100.0, 7.0), (100.0 + wall_s, 7.0)])  # (wall, our CPU) seconds
        write_stat(path, 0)

    def _now(self):
        wall, ours = next(self._clocks)
        return wall, ours, self._busy_ticks()

    def __exit__(self, *exc):
        write_stat(self.path, self.ticks_meanwhile)
        super().__exit__(*exc)


def test_the_share_of_the_cpus_other_processes_took(tmp_path, monkeypatch):
    import os

    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    hz = os.sysconf("SC_CLK_TCK")
    # Other processes ran one CPU's worth of ticks during 0.5 s on 2 CPUs: half the machine.
    with ChangingStat(tmp_path / "stat", ticks_meanwhile=int(0.5 * hz), wall_s=0.5) as contention:
        pass
    assert contention.others_share == pytest.approx(0.5, rel=1e-9) and contention.busy
    with ChangingStat(tmp_path / "stat", ticks_meanwhile=int(0.1 * hz), wall_s=0.5) as contention:
        pass
    assert contention.others_share == pytest.approx(0.1, rel=1e-9) and not contention.busy
    missing = CpuContention(str(tmp_path / "missing")).__enter__()
    assert missing.others_share is None and not missing.busy


class SlowSizeClock(LoadedClock):
    """Blocks of batch size 16 run 4 times slower while `slow(n)` holds for the n-th block."""

    def __init__(self, slow):
        super().__init__(lambda n: 1.0)
        self.slow = slow

    def time_ms(self, run_block) -> float:
        ms = super().time_ms(run_block)
        return ms * 4.0 if 16 in self.ran and self.slow(self.blocks - 1) else ms


def run_time_line(timing):
    stats = timing.stats()
    return fit_line(list(stats), [s.run_time_ms for s in stats.values()])


def test_a_line_bent_by_load_is_measured_again_until_it_is_straight():
    """Load that hit one batch size's blocks at first bends the line; doubling the rounds until
    it fits makes the estimates of the new rounds alone, where that batch size ran quiet."""
    clock = SlowSizeClock(lambda n: n < 40)
    timing = InterleavedTiming(runs(clock), clock, BUDGET)
    timing.measure(max_s=5.0)
    assert run_time_line(timing).r2 < 0.95  # bent: 16 measured only while slowed
    remeasure_while_poor_fit(timing, max_s=5.0)
    line = run_time_line(timing)
    assert (line.slope, line.bias, line.r2) == pytest.approx((SLOPE, BIAS, 1.0))


def test_remeasuring_a_line_that_stays_bent_ends_at_its_time_limit():
    clock = SlowSizeClock(lambda n: True)
    timing = InterleavedTiming(runs(clock), clock, BUDGET)
    timing.measure(max_s=5.0)
    blocks = len(timing.times[32].per_iteration)
    remeasure_while_poor_fit(timing, max_s=0.2)
    assert len(timing.times[32].per_iteration) > 3 * blocks  # doubled more than once
    assert run_time_line(timing).r2 < 0.95


class SamplesPerStepClock(LoadedClock):
    """Accumulation to 128 samples a step: batch size b runs 128 / b micro-batches, each on the line."""

    def time_ms(self, run_block) -> float:
        self.ran.clear()
        run_block()
        self.blocks += 1
        return sum(128 / b * (SLOPE * b + BIAS) for b in self.ran)


def test_micro_batches_that_differ_by_batch_size_are_judged_one_micro_batch_each():
    # Whole iterations take 64 + 256 / b ms: no line fits them, and they were timed for the whole
    # budget. One micro-batch each, they lie on the line, and nothing is timed again.
    clock = SamplesPerStepClock(lambda n: 1.0)
    timing = InterleavedTiming(runs(clock), clock, BUDGET)
    timing.measure(max_s=5.0)
    assert run_time_line(timing).r2 < 0.95
    blocks = clock.blocks
    remeasure_while_poor_fit(timing, max_s=5.0, micro_batches={16: 8, 32: 4, 64: 2})
    assert clock.blocks == blocks
    remeasure_while_poor_fit(timing, max_s=0.2)
    assert clock.blocks > blocks


def test_each_block_counts_the_page_faults_its_iterations_took():
    # Real faults, not timing: an iteration that maps 4 MiB of fresh memory and touches every
    # page takes at least 1,024 minor page faults; one that rewrites memory it already has, none
    # of its own. The clock is the real one, but no time is asserted.
    pages = 1024

    def fresh_pages() -> None:
        region = mmap.mmap(-1, pages * mmap.PAGESIZE)
        for page in range(pages):
            region[page * mmap.PAGESIZE] = 1
        region.close()

    kept = bytearray(pages * mmap.PAGESIZE)

    def same_pages() -> None:
        for page in range(pages):
            kept[page * mmap.PAGESIZE] = 1

    budget = TimingBudget(min_run_s=0.0, max_run_s=0.05, min_block_ms=1.0, min_blocks=3)
    faulting = measure_iteration_time(fresh_pages, CpuClock(), budget)
    quiet = measure_iteration_time(same_pages, CpuClock(), budget)
    assert faulting.page_faults is not None and faulting.page_faults >= pages
    assert quiet.page_faults is not None and quiet.page_faults < pages / 8
