"""The user's batch size: measured, and recorded for the per-line breakdown, in one pass.

warm-up → one recorded iteration, with its peak memory → the first result (its time from single
iterations) → timing → memory kept for good (a leak) → more recorded iterations for fast models, or,
where calls differ, timing again in whole cycles of calls and one whole cycle recorded → the final
breakdown; optimizers found as they step, throughout
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from skyline_engine.attribute.breakdown import EAGER_REPLAY, RECORDED, Breakdown
from skyline_engine.attribute.creation import CreationSites
from skyline_engine.attribute.memory_growth import MemoryGrowth
from skyline_engine.attribute.recording import IterationRecording
from skyline_engine.measure.iteration import IterationRunner, Sample, single_iteration_timing

FirstResult = Callable[[Sample, Breakdown], None]


@dataclass(frozen=True)
class UsersBatchSize:
    sample: Sample
    breakdown: Breakdown
    growth: MemoryGrowth | None  # tensor memory each iteration keeps for good; None when none


def measure_with_breakdown(
    runner: IterationRunner,
    creation: CreationSites,
    batch_size: int,
    *,
    timeline: bool,
    on_first: FirstResult,
    quick_timing: bool = False,
) -> UsersBatchSize:
    """The sample, the breakdown and the memory growth at `batch_size`; `on_first` gets a first
    sample and breakdown as soon as one recorded iteration is broken down. `quick_timing` when the
    batch size is timed again later (with the others). Raises OutOfMemoryAtBatchSize when it does
    not fit."""
    # Optimizers are found as they step, through all of it: one stepped every fifth call (a GAN's
    # generator) may not step in the warm-up.
    with runner.at_batch_size(batch_size) as run, creation.finding_optimizers(runner.entry.relative_path):
        warmup_ms = runner.warm_up(run)
        # Compiled in the warm-up: the recording replays the iteration's eager code (measure/compilation.py).
        mode = RECORDED if runner.compilation is None else EAGER_REPLAY
        recording = IterationRecording(creation, runner.model, runner.device, runner.held_modules)
        memory, recorded_ms = recording.record_first(run, runner.clock, runner.live_tensors)
        micro_batches = recording.micro_batches(batch_size)
        first = Sample(batch_size, single_iteration_timing(warmup_ms, recorded_ms), memory, micro_batches)
        on_first(first, recording.breakdown(first.run_time_ms, memory.peak_bytes, timeline, mode))
        timing = runner.time(run, batch_size, quick=quick_timing)
        growth = recording.memory_growth(run, runner.live_tensors)
        cycle = runner.cycle_of_calls(run, batch_size, timing.run_time_ms)
        if runner.measure_in_cycles(cycle, batch_size, timing.run_time_ms):
            # Timed again in whole cycles: blocks of single calls leaned to the calls without the
            # rarer work (its evaluation every tenth call left out, a loop took 2.4 ms, not 3.7 ms).
            timing = runner.time(run, batch_size, quick=quick_timing)
            runner.align_to_cycle(run)
            memory = recording.record_cycle(run, cycle, runner.live_tensors)
        else:
            recording.record_more(run, timing.run_time_ms)
        final = recording.breakdown(timing.run_time_ms, memory.peak_bytes, timeline, mode)
        return UsersBatchSize(Sample(batch_size, timing, memory, micro_batches), final, growth)
