"""A training script's other batch sizes, for the batch-size models: each measured in a run of the
script of its own, its batch size set in memory (entry/script.py: at its literal, or in the
arguments where the command line gives it; never on disk).

A run is measured as the user's batch size's was (analysis/script.py): the script runs from its
start to its first optimizer step and one whole iteration more (its model found, and its batch size
checked), is warmed up, its memory measured over one iteration (one cycle where iterations differ
in a cycle), then, unless memory alone is asked for, timed; then it is stopped. One run at a time:
a run sets the process's `__main__` and `sys.argv` for as long as it lives, so two cannot be
paused side by side, and the memory measured is then the one run's alone.

So the batch sizes are timed one after another, not in interleaved rounds as an entry point's
are, and the machine's drift between runs is not cancelled. The confirming step therefore times
the suggested batch size again and then the user's again, the reverse of the models' order (the
user's first), and a recommendation stands only where the suggested batch size is faster in both
orders by more than the noise (`ScriptPredictions._confirm`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from skyline_engine.analysis.fitting import ONE_SAMPLE, Confirmed, busy_machine_note, fit_models, withheld_where_busy
from skyline_engine.analysis.probing import Probing
from skyline_engine.analysis.script_source import ScriptSource
from skyline_engine.entry.script import TrainingScript, load_training_script
from skyline_engine.errors import EntryPointError, UserCodeError
from skyline_engine.measure.contention import CpuContention, busiest
from skyline_engine.measure.device import DeviceInfo
from skyline_engine.measure.iteration import OutOfMemoryAtBatchSize, Sample, counting_gradients
from skyline_engine.measure.memory import MemoryProfile, is_out_of_memory, measure_memory, release_cached_memory
from skyline_engine.measure.script_model import watching_outermost_calls
from skyline_engine.measure.script_run import Pacer, ScriptRun
from skyline_engine.measure.timing import TimingBudget, TimingStats, clock_for
from skyline_engine.predict.batch_models import BatchSizeModels, usable_memory_bytes
from skyline_engine.predict.recommendation import (
    TIMED_IN_TURN,
    Recommendation,
    candidate,
    compared,
    noise,
    range_checked,
    range_probe,
    recommend,
    too_noisy,
)

Progress = Callable[[str, float], None]

# How the models' batch sizes were timed, for the busy machine's note (analysis/fitting.py).
_ONE_AFTER_ANOTHER = (
    "one after another, each in a run of the script of its own, so their comparison holds no better than"
)


class LiteralNotTheBatchSize(Exception):
    """Setting the batch size where the script takes it did not change the batches the model got:
    no other batch size can be measured (`reason` says so, for the document)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class UsersIteration:
    """What the user's batch size's run found that the other runs go by: the batch size, its
    micro-batches (attribute/recorder.py's count), its backward passes per iteration (to scale the
    micro-batches of a run whose passes differ: accumulation to a fixed number of samples per step),
    and the iterations measured together where they differ in a cycle (1 where they do not)."""

    batch_size: int
    micro_batches: int
    backward_passes: float
    cycle: int = 1

    def micro_batches_at(self, backward_passes: float) -> int:
        """The micro-batches of a run with `backward_passes` per iteration: the user's where they
        are the user's (a sharpness-aware step's two passes on one batch are one micro-batch), and
        one where the user's iteration has one (a loop that splits its batch into chunks of a fixed
        size makes more passes at larger batch sizes, not more micro-batches)."""
        if self.micro_batches == 1 or self.backward_passes <= 0:
            return self.micro_batches
        return max(1, round(backward_passes * self.micro_batches / self.backward_passes))


@dataclass(frozen=True)
class ScriptTarget:
    """What runs the script again: the file, its project, its arguments as the user gave them, and
    how long a run may go without a step."""

    path: Path
    project_root: Path
    argv: tuple[str, ...]
    step_timeout_s: float
    pacer: Pacer | None = None  # a data-parallel script's other ranks (analysis/script_ranks.py)


class ScriptBatchSizes:
    """Runs of the script at other batch sizes, one at a time; `samples` keeps each one timed."""

    def __init__(
        self,
        target: ScriptTarget,
        users: UsersIteration,
        device: torch.device,
        budget: TimingBudget,
        progress: Progress,
    ) -> None:
        self.target = target
        self.users = users
        self.cycle = users.cycle
        self.device = device
        self.budget = budget
        self.progress = progress
        self.samples: dict[int, Sample] = {}

    def memory_and_time(self, batch_size: int) -> MemoryProfile:
        """Probing's measurement of a batch size for the models: its memory, and its time kept."""
        sample = self.measure(batch_size)
        self.samples[batch_size] = sample
        return sample.memory

    def memory_alone(self, batch_size: int) -> MemoryProfile:
        return self.measure(batch_size, timed=False).memory

    def measure(self, batch_size: int, timed: bool = True) -> Sample:
        """One run of the script at `batch_size`, measured. OutOfMemoryAtBatchSize where it does
        not fit; a UserCodeError (its `batch_size` set) where the script fails there, ends before
        enough iterations or gives the model batches of another size; LiteralNotTheBatchSize
        where the batches stay the user's."""
        script = load_training_script(self.target.path, self.target.project_root, self.target.argv, batch_size)
        try:
            with ScriptRun(script, self.target.step_timeout_s, self.target.pacer) as run:
                return self._measure_run(script, run, batch_size, timed)
        except UserCodeError as exc:
            if exc.__cause__ is not None and is_out_of_memory(exc.__cause__):
                raise OutOfMemoryAtBatchSize(batch_size, exc.__cause__, (exc.path, exc.line)) from None
            exc.batch_size = batch_size
            raise
        except EntryPointError as exc:  # it ended, or stepped no more, at this batch size
            failed = UserCodeError(exc.message, path=exc.path, line=exc.line, hint=exc.hint)
            failed.batch_size = batch_size
            raise failed from None
        finally:
            release_cached_memory(self.device)

    def _measure_run(self, script: TrainingScript, run: ScriptRun, batch_size: int, timed: bool) -> Sample:
        run.iteration()  # its setup and first iteration
        with watching_outermost_calls() as calls:
            run.iteration()
        found = calls.model(run.optimizer)
        model, got = found if found is not None else (None, None)
        if model is None or got != batch_size:
            raise self._not_taken(script, batch_size, got)
        source = ScriptSource(run, model, batch_size, clock_for(self.device), self.budget)
        source.cycle = self.cycle
        with source.live_tensors.frozen(), contextlib.closing(source):
            warmup_ms = source.warm_up()
            with counting_gradients(model) as gradients:  # over one whole cycle, where iterations differ in one
                memory = measure_memory(self.device, self._whole_cycle(source), source.live_tensors)
            micro_batches = self.users.micro_batches_at(gradients.backward_passes / self.cycle)
            timing = source.time() if timed else TimingStats(warmup_ms, 0.0, 1, 1, relative_error=math.inf)
        return Sample(batch_size, timing, memory, micro_batches)

    def _whole_cycle(self, source: ScriptSource) -> Callable[[], None]:
        def whole_cycle() -> None:
            for _ in range(self.cycle):
                source.run_recorded()

        return whole_cycle

    def _not_taken(self, script: TrainingScript, batch_size: int, got: int | None) -> Exception:
        where = script.where_set()
        if got == self.users.batch_size:
            return LiteralNotTheBatchSize(
                f"Batch size {batch_size} was set at {where} to measure it, but the model still got batches of "
                f"{got}: that is not where this script's batch size is set, so no other batch size can be measured "
                "and nothing is predicted."
            )
        failed = UserCodeError(
            f"Batch size {batch_size}, set at {where}, gave the model batches of {got} (the script's data may "
            "hold fewer samples than a batch).",
            path=script.literal_set.path if script.literal_set else script.relative_path,
            line=script.literal_set.line if script.literal_set else None,
        )
        failed.batch_size = batch_size
        return failed


@dataclass
class ScriptPredictions:
    """The models of a script's batch sizes and what confirms them, for the document."""

    samples: list[Sample]
    models: BatchSizeModels | None
    models_withheld: str | None
    memory_only: dict[int, MemoryProfile] = field(default_factory=dict)
    checks: list[Sample] = field(default_factory=list)
    recommendation: Recommendation | None = None
    notes: list[str] = field(default_factory=list)


def predict_script_sizes(
    sizes: ScriptBatchSizes, users: Sample, device: DeviceInfo, budget: TimingBudget, progress: Progress
) -> ScriptPredictions:
    """Half and twice the user's batch size (`users`, measured in the first run; more, where
    memory needs it: analysis/probing.py), each in a run of its own; the models; the confirming
    runs."""
    usable = usable_memory_bytes(device.memory_capacity_bytes)
    probing = Probing(
        sizes.memory_and_time,
        usable,
        progress,
        users.batch_size,
        users.memory,
        measure_memory_only=sizes.memory_alone,
    )
    try:
        with CpuContention() as contention:
            probing.probe()
            seconds_per_sample = users.run_time_ms * sizes.cycle / users.batch_size / 1000
            probing.settle_memory(seconds_per_sample, budget.memory_probe_s)
    except LiteralNotTheBatchSize as exc:
        return ScriptPredictions([users], None, exc.reason, notes=[exc.reason])
    samples = sorted([users, *(sizes.samples[b] for b in probing.memory if b in sizes.samples)], key=_size)
    notes = [*probing.notes]
    busy = busy_machine_note(contention, _ONE_AFTER_ANOTHER)
    if busy:
        notes.append(busy)
    progress("fitting the batch-size models", 0.9)
    memory = {**probing.memory, **probing.memory_only}
    models = fit_models(samples, memory, device, probing.failing, users.batch_size)
    if models is None:
        return ScriptPredictions(samples, None, ONE_SAMPLE, probing.memory_only, notes=[*notes, ONE_SAMPLE])
    confirming = ScriptConfirming(sizes, models, samples, probing, budget)
    with CpuContention() as confirming_contention:
        confirmed = confirming.run()
    return ScriptPredictions(
        samples,
        confirming.models,  # as confirmed.models: cut where the line bends
        None,
        probing.memory_only,
        confirmed.checks,
        withheld_where_busy(confirmed.recommendation, busiest(contention, confirming_contention), device),
        [*notes, *confirmed.notes, *confirming.models.warnings()],
    )


def _size(sample: Sample) -> int:
    return sample.batch_size


class ScriptConfirming:
    """The confirming step of a script (as an entry point's, analysis/session.py `_confirm`): the
    batch size the models suggest and a probe past the timed ones, each in a run of its own where
    one iteration is predicted to be affordable, then the user's batch size again, last. With the
    models' runs (the user's first), each pair was timed in both orders; the recommendation
    stands where both say the suggested batch size is faster."""

    def __init__(
        self,
        sizes: ScriptBatchSizes,
        models: BatchSizeModels,
        samples: list[Sample],
        probing: Probing,
        budget: TimingBudget,
    ) -> None:
        self.sizes = sizes
        self.models = models
        self.samples = samples
        self.probing = probing
        self.budget = budget
        self.users = sizes.users.batch_size
        self.not_timed: dict[int, str] = {}
        self.notes: list[str] = []

    def affordable(self, batch_size: int) -> bool:
        predicted = self.models.predict(batch_size).run_time_ms
        return predicted is not None and predicted <= self.budget.max_run_s / self.budget.min_blocks * 1000

    def suggestion(self) -> int | None:
        return None if too_noisy(self.samples) else candidate(self.models, self.users).batch_size

    def run(self) -> Confirmed:
        suggested = self.suggestion()
        probe = range_probe(self.models, suggested, self.affordable)
        if probe is None and range_probe(self.models, suggested, lambda batch_size: True) is not None:
            self.models = dataclasses.replace(self.models, range_unprobed=True)
            suggested = self.suggestion()
        wanted = sorted({b for b in (suggested, probe) if b is not None and b != self.users})
        if suggested in wanted and not self.affordable(suggested):
            seconds = (self.models.predict(suggested).run_time_ms or math.inf) / 1000
            self.not_timed[suggested] = (
                f"one iteration there is predicted to take {seconds:.1f} s, and {self.budget.min_blocks} of them "
                f"would overrun the {self.budget.max_run_s:g} s a run spends timing; profile with --batch-size "
                f"{suggested} to measure it"
            )
            wanted.remove(suggested)
        checks = self._time_after_the_models(wanted)
        if checks:
            self._check_the_range(checks, probe)
            checks = self._confirm_what_the_cut_suggests(checks)
        self.models = self.models.with_checks(checks)
        recommendation = recommend(self.models, self.users, self.samples, checks, self.not_timed, TIMED_IN_TURN)
        recommendation = in_both_orders(recommendation, self.users, self.samples, checks)
        return Confirmed(self.models, checks, recommendation, self.notes)

    def _time_after_the_models(self, wanted: list[int]) -> list[Sample]:
        """`wanted`, then the user's batch size, each in a run of its own; none where none of
        `wanted` could be measured."""
        checks: list[Sample] = []
        for batch_size in wanted:
            self.sizes.progress(f"confirming batch size {batch_size} (a run of the script)", 0.92)
            try:
                checks.append(self.sizes.measure(batch_size))
            except OutOfMemoryAtBatchSize:
                self.notes.append(f"Batch size {batch_size} ran out of memory: stay below it on this device.")
                self.not_timed[batch_size] = "it ran out of memory (see the warnings)"
            except UserCodeError as exc:
                self.probing.fails(batch_size, exc)
                self.not_timed[batch_size] = "your code fails there (see the warnings)"
        if not checks:
            return []
        self.sizes.progress(f"confirming batch size {self.users} again (a run of the script)", 0.96)
        checks.append(self.sizes.measure(self.users))
        self.models = dataclasses.replace(self.models, failing_batch_sizes=tuple(sorted(self.probing.failing)))
        return sorted(checks, key=_size)

    def _confirm_what_the_cut_suggests(self, checks: list[Sample]) -> list[Sample]:
        """Where cutting the trusted range moved the suggestion to a batch size these `checks` did
        not time (one of the models' runs, timed only after the user's), that batch size and the
        user's again, each in a run of its own, in place of the user's first confirming run: the
        recommendation then rests on runs in both orders, as every other one does."""
        suggested = self.suggestion()
        timed = {s.batch_size for s in checks}
        if suggested is None or suggested in timed or suggested in self.not_timed or not self.affordable(suggested):
            return checks
        again = self._time_after_the_models([suggested])
        if not again:
            return checks
        return sorted([*(s for s in checks if s.batch_size != self.users), *again], key=_size)

    def _check_the_range(self, checks: list[Sample], probe: int | None) -> None:
        by_size = {s.batch_size: s for s in checks}
        if probe not in by_size:
            return
        self.models, missed = range_checked(self.models, by_size[self.users], by_size[probe])
        self.notes.extend([missed] if missed else [])


def in_both_orders(
    recommendation: Recommendation, users: int, samples: list[Sample], checks: list[Sample]
) -> Recommendation:
    """A script's recommendation (made from `checks`: the suggested batch size timed, then the
    user's batch size `users` again, last), where the suggested batch size also beat the user's
    timed before it (in `samples`, the models' runs, the user's first: its own run there, or else
    its confirming run); withheld where the order of the runs decides."""
    chosen = recommendation.batch_size
    if chosen is None or chosen == users:
        return recommendation
    if chosen not in {s.batch_size for s in checks}:
        return Recommendation.none(
            f"{chosen:,}, which the models suggest, was timed only in a run after yours ({users:,}): a script's batch "
            "sizes are timed in runs one after another, and one order cannot tell the machine's drift from a gain; "
            f"profile with --batch-size {chosen} to measure it"
        )
    yours = next(s for s in samples if s.batch_size == users)
    theirs = next(s for s in [*samples, *checks] if s.batch_size == chosen)
    gain = theirs.samples_per_second / yours.samples_per_second
    if gain >= 1 + noise(yours, theirs):
        return recommendation
    return Recommendation.none(
        f"{chosen:,}, which the models suggest, ran faster than yours ({users:,}) timed after it, but "
        f"{compared(gain)} yours timed before it: a script's batch sizes are timed in runs one after another, "
        "and here their order decides; profile again on a quiet machine"
    )
