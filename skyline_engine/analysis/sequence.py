"""The measurement sequence of one batch size, the same for every source of iterations:

warm-up → memory (apart, or in the first recorded iteration) → the first recorded iteration (the
first result, from single iterations) → memory kept for good (a leak) → timing → where calls
differ, timing again in whole cycles of calls and one whole cycle's memory and recording; else a
few more recorded iterations (more where other processes kept the CPUs busy while timing) → the
breakdown

An `IterationSource` says where the iterations come from: one process's runner (`OneProcess`), a
rank of data-parallel training (analysis/distributed.py). The steps are the sequence's; a source
answers how each is done for it.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable

from skyline_engine.attribute.breakdown import EAGER_REPLAY, RECORDED, Breakdown
from skyline_engine.attribute.memory_growth import MemoryGrowth
from skyline_engine.attribute.recording import IterationRecording
from skyline_engine.measure.contention import CpuContention
from skyline_engine.measure.iteration import IterationRunner, Run, Sample, single_iteration_timing
from skyline_engine.measure.memory import LiveTensors, MemoryProfile
from skyline_engine.measure.thread_waits import ThreadWaits, thread_waits
from skyline_engine.measure.timing import Clock, TimingStats

FirstResult = Callable[[Sample, Breakdown], None]
GrowthKnownNone = Callable[[int, MemoryProfile], bool]


class IterationSource:
    """The iterations of one batch size, as the sequence's steps need them. Subclasses give the
    steps without a default (warm_up, run_recorded, time, measure_in_cycles, align_to_cycle)."""

    batch_size: int
    clock: Clock
    live_tensors: LiveTensors
    # More recorded iterations are combined into the breakdown where the source allows it, and
    # more again on a busy machine where it runs as many iterations as asked (a script may end).
    records_more = True
    records_while_busy = True

    @property
    def compiled(self) -> bool:
        """Whether torch.compile compiled the iteration (read after the warm-up, which compiles
        it): the recording then replays its eager code (measure/compilation.py)."""
        return False

    def warm_up(self) -> float:
        """The warm-up iterations; the time of the last one, in ms."""
        raise NotImplementedError

    def run_recorded(self) -> None:
        """One iteration as it is recorded for the breakdown."""
        raise NotImplementedError

    def memory(self) -> MemoryProfile | None:
        """The memory of an iteration measured apart from the recording (over one whole cycle of
        calls where it is measured in cycles); None where the recorded iteration's is the one."""
        return None

    def watching_first(self) -> contextlib.AbstractContextManager[None]:
        """What watches the first recorded iteration beside the recorder."""
        return contextlib.nullcontext()

    def time(self) -> TimingStats:
        """The iteration as trained, timed."""
        raise NotImplementedError

    def recorded_run_time_ms(self, timing: TimingStats) -> float:
        """The time the breakdown is fitted to: the recorded iteration's (`timing` is `time`'s)."""
        return timing.run_time_ms

    def measure_in_cycles(self, run_time_ms: float) -> int | None:
        """The calls in a cycle where the iteration's calls differ and, from now on, are measured
        in whole cycles (measure/work_per_call.py); None where they are not."""
        raise NotImplementedError

    def align_to_cycle(self) -> None:
        """Recorded calls until the next one starts a cycle."""
        raise NotImplementedError


@dataclass(frozen=True)
class BatchSizeMeasurement:
    sample: Sample
    breakdown: Breakdown  # not yet fitted to the document's iteration time
    growth: MemoryGrowth | None  # tensor memory each iteration keeps for good; None when none
    # The CPU threads' wait at each parallel region while timing (measure/thread_waits.py); None
    # when they did not wait.
    waits: ThreadWaits | None = None

    def warnings(self) -> list[str]:
        """What the measurement found to warn of: memory kept for good (a leak), threads that
        waited for a core."""
        return [found.warning() for found in (self.growth, self.waits) if found is not None]


def measure_batch_size(
    source: IterationSource,
    recording: IterationRecording,
    *,
    timeline: bool,
    on_first: FirstResult | None = None,
    contention: Callable[[], CpuContention] = CpuContention,
    growth_known_none: GrowthKnownNone | None = None,
) -> BatchSizeMeasurement:
    """The sample, the breakdown and the memory growth of `source`'s batch size, recorded by
    `recording`. `on_first` gets a first sample and breakdown as soon as one recorded iteration
    is broken down. `contention` measures how busy other processes kept the CPUs while timing
    (tests give a machine's counters). `growth_known_none`, given the first recorded iteration's
    memory, says whether the memory growth check can be skipped: a previous analysis of the same
    code found none (analysis/known_memory.py)."""
    batch_size = source.batch_size
    warmup_ms = source.warm_up()
    mode = EAGER_REPLAY if source.compiled else RECORDED
    apart = source.memory()
    with source.watching_first():
        recorded, recorded_ms = recording.record_first(source.run_recorded, source.clock, source.live_tensors)
    memory = apart or recorded
    micro_batches = recording.micro_batches(batch_size)
    if on_first is not None:
        first = Sample(batch_size, single_iteration_timing(warmup_ms, recorded_ms), memory, micro_batches)
        breakdown = recording.breakdown(first.run_time_ms, memory.peak_bytes, timeline, mode, memory.program)
        on_first(first, breakdown)
    if growth_known_none is not None and growth_known_none(batch_size, memory):
        growth = None
    else:
        growth = recording.memory_growth(source.run_recorded, source.live_tensors)
    with contention() as others:
        timing = source.time()
    waits = thread_waits(recording.device)  # the state the iterations were just timed in
    cycle = source.measure_in_cycles(timing.run_time_ms)
    if cycle is not None:
        # Timed again in whole cycles: blocks of single calls leaned to the calls without the
        # rarer work (its evaluation every tenth call left out, a loop took 2.4 ms, not 3.7 ms).
        timing = source.time()
        apart = source.memory()
        source.align_to_cycle()
        recorded = recording.record_cycle(source.run_recorded, cycle, source.live_tensors)
        memory = apart or recorded
    elif source.records_more:
        recording.record_more(source.run_recorded, timing.run_time_ms, others.busy and source.records_while_busy)
    breakdown = recording.breakdown(
        source.recorded_run_time_ms(timing), memory.peak_bytes, timeline, mode, program_peak=memory.program
    )
    return BatchSizeMeasurement(Sample(batch_size, timing, memory, micro_batches), breakdown, growth, waits)


class OneProcess(IterationSource):
    """The iterations of one process's runner at one batch size (`run`, inside its
    `at_batch_size`)."""

    def __init__(self, runner: IterationRunner, run: Run, batch_size: int) -> None:
        self.runner = runner
        self.run = run
        self.batch_size = batch_size
        self.clock = runner.clock
        self.live_tensors = runner.live_tensors

    @property
    def compiled(self) -> bool:
        return self.runner.compilation is not None

    def warm_up(self) -> float:
        return self.runner.warm_up(self.run)

    def run_recorded(self) -> None:
        self.run()

    def memory(self) -> MemoryProfile | None:
        """A compiled model's on CUDA: its own program's, apart from the recorded eager replay."""
        return self.runner.memory(self.run) if self.runner.measures_program_memory else None

    def time(self) -> TimingStats:
        return self.runner.time(self.run, self.batch_size)

    def measure_in_cycles(self, run_time_ms: float) -> int | None:
        cycle = self.runner.cycle_of_calls(self.run, self.batch_size, run_time_ms)
        return cycle if self.runner.measure_in_cycles(cycle, self.batch_size, run_time_ms) else None

    def align_to_cycle(self) -> None:
        self.runner.align_to_cycle(self.run)
