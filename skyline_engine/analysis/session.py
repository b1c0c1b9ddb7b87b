"""One analysis, end to end:

load the entry point → build the iteration (recording where parameters are created)
→ the user's batch size, measured and broken down → the memory of other batch sizes
→ every batch size timed together, in interleaved rounds → the batch-size models → the batch size
they suggest, and a probe past the timed ones, timed beside the user's (the recommendation) → the document
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from time import perf_counter  # bound now: user code may replace time's (freezegun)
from typing import Any, Callable

from skyline_engine.analysis.assembly import build_document, with_output_note
from skyline_engine.analysis.document import AnalysisDocument
from skyline_engine.analysis.fitting import (
    NOT_ASKED,
    ONE_SAMPLE,
    Confirmed,
    busy_machine_note,
    fit_models,
    withheld_where_busy,
    withheld_where_threads_waited,
)
from skyline_engine.analysis.known_memory import KnownMemory, Reuse, remembered
from skyline_engine.analysis.probing import Probing
from skyline_engine.analysis.script import analyze_script
from skyline_engine.analysis.sequence import BatchSizeMeasurement, OneProcess, measure_batch_size
from skyline_engine.attribute.breakdown import Breakdown
from skyline_engine.attribute.creation import CreationSites
from skyline_engine.attribute.frames import CallSites
from skyline_engine.attribute.memory_growth import GROWING_MEMORY, MemoryGrowth
from skyline_engine.attribute.recording import IterationRecording
from skyline_engine.entry.batch_size import BatchSizeLocation, find_batch_size_location
from skyline_engine.entry.code_digest import code_digest
from skyline_engine.entry.contract import INPUT_PROVIDER
from skyline_engine.entry.loader import EntryPoint, load_entry_point, read_source, resolve_entry_path
from skyline_engine.entry.script import is_script
from skyline_engine.entry.user_output import first_lines_of_user_output
from skyline_engine.errors import EntryPointError, OutOfMemory, SkylineError, UserCodeError
from skyline_engine.measure.compilation import is_compiled
from skyline_engine.measure.contention import CpuContention, busiest
from skyline_engine.measure.device import DeviceInfo, describe_device, resolve_device, torch_version
from skyline_engine.measure.inputs import InputsIgnoreBatchSize
from skyline_engine.measure.iteration import IterationRunner, OutOfMemoryAtBatchSize, Sample
from skyline_engine.measure.memory import MemoryProfile, address_space_limit, cublas_workspace_bytes
from skyline_engine.measure.runtime import runtime_changes
from skyline_engine.measure.script_run import Pacer
from skyline_engine.measure.thread_waits import thread_waits
from skyline_engine.measure.timing import Decided, InterleavedTiming, TimingBudget, TimingStats
from skyline_engine.predict.batch_models import BatchSizeModels, beyond_a_failure, fits_poorly, usable_memory_bytes
from skyline_engine.predict.linear import fit_line
from skyline_engine.predict.recommendation import (
    candidate,
    comparisons_decided,
    range_checked,
    range_probe,
    recommend,
    too_noisy,
)

Progress = Callable[[str, float], None]
Partial = Callable[[AnalysisDocument], None]
Remember = Callable[[KnownMemory], None]
# Whether the confirming rounds so far decide their comparisons: their measurements, and the
# relative standard error of each one's mean, by batch size (predict/recommendation.py).
DecidedBy = Callable[[Mapping[int, Sample], Mapping[int, float]], bool]


def no_progress(phase: str, fraction: float) -> None:
    pass


@dataclass
class AnalysisRequest:
    entry_point: str
    project_root: Path
    batch_size: int | None = None
    device: str = "auto"
    budget: TimingBudget = field(default_factory=TimingBudget)
    # Where a relative `entry_point` is looked up (the CLI's working directory); the root if None.
    base_dir: Path | None = None
    # Include the recorded iteration's operations one by one (`timeline`, for a trace file).
    timeline: bool = False
    # Probe other batch sizes and fit the batch-size models (the breakdown alone is quicker).
    predict: bool = True
    # Plan for a device with this much memory instead of the one measured on (None: its own).
    memory_capacity_bytes: int | None = None
    # What set this process's address-space limit, named when an allocation fails under it.
    memory_limit_source: str = "ulimit -v"
    # Ranks of DistributedDataParallel training on this machine (1: one process, no DDP).
    world_size: int = 1
    # Plan the scaling predictions for this link (gigabits per second) instead of the measured one.
    interconnect_gbps: float | None = None
    # The rendezvous port of the ranks Skyline starts (None: a free one).
    port: int | None = None
    # How long a rank's collective waits for the others before the analysis fails (None: 120 s).
    collective_timeout_s: float | None = None
    # A training script's own arguments (`skyline profile train.py -- --epochs 1`): its `sys.argv[1:]`.
    script_args: tuple[str, ...] = ()
    # How long a training script may run without an optimizer step (None: 300 s).
    step_timeout_s: float | None = None
    # A training script: write `batch_size` at its literal in the file once its model showed that
    # literal is its batch size (--set-batch-size); else the literal is set in memory only.
    write_batch_size: bool = False
    # What the previous analysis of this entry point measured of the memory (the service keeps
    # it between analyses): taken where it still holds (analysis/known_memory.py).
    known_memory: KnownMemory | None = None


def analyze(
    request: AnalysisRequest,
    progress: Progress = no_progress,
    partial: Partial | None = None,
    remember: Remember | None = None,
) -> AnalysisDocument:
    """Run one analysis and return its document.

    `partial`, when given, receives early documents (`models` None, no predictions): the first as
    soon as one iteration at the user's batch size is broken down (its time from that one
    iteration, `repetitions` 1), then, when predicting, the user's batch size timed in full,
    before the other batch sizes are probed. `remember`, when given, receives what the next
    analysis of the same code may take from this one (an entry point's complete analysis).
    """
    _check_batch_size(request.batch_size)
    if request.world_size > 1:
        from skyline_engine.analysis.launch import analyze_on_ranks  # it builds on this module

        return analyze_on_ranks(request, progress)
    root = Path(request.project_root).resolve()
    path = resolve_entry_path(request.entry_point, root, request.base_dir)
    relative = str(path.relative_to(root))
    if is_script(read_source(path, relative)):
        return analyze_script_request(request, path, root, progress, partial)
    if request.script_args:
        raise EntryPointError(
            f"{relative} is an entry point (it defines Skyline's providers), and the arguments after `--` are a "
            "training script's own: an entry point takes none.",
            path=relative,
            hint="Leave out what follows `--`, or profile the training script itself.",
        )
    progress("loading the entry point", 0.0)
    device = resolve_device(request.device)
    device_info = describe_device(device, request.memory_capacity_bytes)
    entry = load_entry_point(path, root)
    try:
        with first_lines_of_user_output() as output:
            analysis = _Analysis(request, entry, device_info, progress, partial)
            document = analysis.run()
            if remember is not None:
                analysis.hand_on(remember)
        workspaces = cublas_workspace_bytes(device)  # once nothing is measured any more: it frees them
        document = dataclasses.replace(document, breakdown=document.breakdown.with_workspaces(workspaces))
    finally:
        entry.unload()
    progress("done", 1.0)
    return with_output_note(document, output)


def analyze_script_request(
    request: AnalysisRequest,
    path: Path,
    root: Path,
    progress: Progress,
    partial: Partial | None = None,
    pacer: Pacer | None = None,
) -> AnalysisDocument:
    """A file without the providers: a training script, run as `python SCRIPT arguments` would
    (with its batch-size literal set to `request.batch_size` in memory, where given); `pacer`:
    a data-parallel script's other ranks (analysis/script_ranks.py)."""
    return analyze_script(
        request.budget,
        path,
        root,
        script_args=tuple(request.script_args),
        batch_size=request.batch_size,
        write_batch_size=request.write_batch_size,
        step_timeout_s=request.step_timeout_s,
        timeline=request.timeline,
        memory_capacity_bytes=request.memory_capacity_bytes,
        predict=request.predict,
        progress=progress,
        partial=partial,
        pacer=pacer,
    )


class _Analysis:
    """One loaded entry point, analysed."""

    def __init__(
        self,
        request: AnalysisRequest,
        entry: EntryPoint,
        device: DeviceInfo,
        progress: Progress,
        partial: Partial | None,
    ) -> None:
        self.request = request
        self.entry = entry
        self.device = device
        self.progress = progress
        self.partial = partial
        self.batch_size = request.batch_size or entry.default_batch_size
        self.location = batch_size_location(entry)
        self.runner: IterationRunner | None = None
        self.growth: MemoryGrowth | None = None  # tensor memory each iteration keeps, once measured
        # The busiest of the rounds that timed batch sizes together: what the models and the
        # recommendation compare was timed beside how busy other processes kept the CPUs.
        self.busiest_rounds: CpuContention | None = None
        known = request.known_memory
        self.device_key = f"{device.name} ({device.torch_device}), torch {torch_version()}"
        unchanged = known is not None and known.unchanged(Path(entry.files.root), self.location, self.device_key)
        self.reuse = Reuse(known if unchanged else None)
        # The code as loaded: what the next analysis may take from this one is handed on only
        # where it is still the code at the end (a save during the analysis changes it).
        self.code = code_digest(Path(entry.files.root), self._code_files(), self.location)
        self.memory: dict[int, MemoryProfile] = {}  # every batch size's, measured or taken: for the next analysis
        self._build_document = functools.partial(
            build_document,
            project_root=str(entry.files.root),
            entry_point=entry.relative_path,
            torch_version=torch_version(),
            device=device,
            batch_size=self.batch_size,
            batch_size_location=self.location,
        )

    def document(self, **parts: Any) -> AnalysisDocument:
        """The document of what is measured so far, with what torch.compile compiled meanwhile, and
        whether the iteration's calls differ."""
        compilation = self.runner.compilation if self.runner is not None else None
        breakdown = parts.get("breakdown")
        recorded = breakdown.attribution.recorded_iterations if breakdown is not None else 1
        differing = self.runner.work_at(self.batch_size).warning(recorded) if self.runner is not None else None
        if differing is not None:
            parts["warnings"] = [differing, *parts["warnings"]]
        changes = runtime_changes(os.environ, self.runner is not None and self.runner.malloc_pinned)
        return self._build_document(
            compilation=compilation,
            memory_growth=self.growth,
            runtime_changes=changes,
            reused=self.reuse.reused(),
            **parts,
        )

    def known_memory(self, runner: IterationRunner, batch_size: int) -> MemoryProfile | None:
        """The memory of `batch_size` taken from the previous analysis, where it holds (after the
        warm-up the batch size is due); None where it is to be measured (`memory_at`)."""
        if not self.reuse.knows(batch_size):
            return None
        runner.warm_up_at(batch_size)  # out of memory there raises as measuring would
        profile = self.memory[batch_size] = self.reuse.take(batch_size)
        return profile

    def memory_at(self, runner: IterationRunner, batch_size: int) -> MemoryProfile:
        """The memory of `batch_size`, measured (and kept for the next analysis)."""
        profile = self.memory[batch_size] = runner.memory_at(batch_size)
        return profile

    def hand_on(self, remember: Remember) -> None:
        """Hand on what this analysis measured of the memory, where the code it loaded is still the
        code on disk (with the modules it imported later, as they are now)."""
        code = code_digest(Path(self.entry.files.root), self._code_files(), self.location)
        if self.code is None or code is None or any(code.get(path) != digest for path, digest in self.code.items()):
            return
        # What it took still holds: with it, the batch sizes of analyses before it stay known.
        memory = {**(self.reuse.known.memory if self.reuse.known is not None else {}), **self.memory}
        known = remembered(code, self.device_key, memory, self.growth is None)
        if known is not None:
            remember(known)

    def _code_files(self) -> set[str]:
        """The entry point and the project's modules imported so far."""
        return {self.entry.relative_path, *self.entry.files.loaded()}

    def run(self) -> AnalysisDocument:
        self.progress("building the model", 0.0)
        creation = CreationSites(CallSites(self.entry.files))
        with creation.recording_modules():  # where each parameter is created: its line's memory
            runner = self.runner = IterationRunner(self.entry, self.device.torch_device, self.request.budget)
        with runner:
            measured = self._users_batch_size(runner, creation)
            users, breakdown, self.growth = measured.sample, measured.breakdown, measured.growth
            self.memory[self.batch_size] = users.memory
            notes = [*runner.notes, *measured.warnings()]  # the warm-up's, a leak, threads that waited
            if not self.request.predict:
                return self.document(
                    samples=[users], breakdown=breakdown, models=None, warnings=notes, models_withheld=NOT_ASKED
                )
            self._send(users, breakdown, notes)
            if self.growth is not None and self.growth.skews_peaks(users.peak_memory_bytes):
                # Each batch size's peak would depend on when it was measured: the user's alone, timed in full.
                samples, timing_notes = self._time_alone(runner, users)
                return self.document(
                    samples=samples,
                    breakdown=breakdown,
                    models=None,
                    warnings=notes + timing_notes,
                    models_withheld=GROWING_MEMORY,
                )
            usable = usable_memory_bytes(self.device.memory_capacity_bytes)
            probing = Probing(
                functools.partial(self.memory_at, runner),
                usable,
                self.progress,
                self.batch_size,
                users.memory,
                known=functools.partial(self.known_memory, runner),
            )
            try:
                sizes = probing.probe()
                # A memory probe runs a whole cycle where calls differ (IterationRunner.measure_in_cycles).
                seconds_per_sample = users.run_time_ms * runner.cycle / self.batch_size / 1000
                probing.settle_memory(seconds_per_sample, self.request.budget.memory_probe_s)
                samples, timing_notes = self._time_together(runner, sizes, users, probing.memory, probing)
            except InputsIgnoreBatchSize as exc:
                # Every batch size would measure the same iteration: the user's alone, timed in full.
                samples, timing_notes = self._time_alone(runner, users)
                ignored = exc.warning(INPUT_PROVIDER, self._input_provider_line())
                return self.document(
                    samples=samples,
                    breakdown=breakdown,
                    models=None,
                    warnings=notes + timing_notes + [ignored],
                    models_withheld=ignored,
                )
            self.progress("fitting the batch-size models", 0.9)
            memory = {**probing.memory, **probing.memory_only}
            models = fit_models(samples, memory, self.device, probing.failing, self.batch_size)
            confirmed = self._confirm(runner, models, samples, probing, users) if models else Confirmed(models)
            # Probed again after every round: the state can begin later in a process.
            waits = measured.waits or thread_waits(runner.device)
        models = confirmed.models
        warnings = (
            notes
            + ([waits.warning()] if waits and not measured.waits else [])
            + probing.notes
            + timing_notes
            + confirmed.notes
            + (models.warnings() if models else [ONE_SAMPLE])
        )
        return self.document(
            samples=samples,
            breakdown=breakdown,
            models=models,
            warnings=warnings,
            memory_only=probing.memory_only,
            models_withheld=None if models else ONE_SAMPLE,
            checks=confirmed.checks,
            recommendation=withheld_where_busy(
                withheld_where_threads_waited(confirmed.recommendation, waits), self.busiest_rounds, self.device
            ),
            # The time the user's training gets: their batch size timed alone, before any other
            # ran in this process. Timed beside the others, the same batch size read 11-32 % faster
            # or slower than plain loops (the allocator's and the caches' state follow what ran
            # before); the models compare the batch sizes in their own rounds.
            iteration=users,
        )

    def _confirm(
        self,
        runner: IterationRunner,
        models: BatchSizeModels,
        samples: list[Sample],
        probing: Probing,
        headline: Sample,
    ) -> Confirmed:
        """The confirming step, once the models are fitted: the batch size they suggest
        (predict/recommendation.py, `candidate`), where it was not timed with them, and, before the
        trusted range extends past the timed batch sizes, one probe there (`range_probe`), timed
        together beside the user's batch size in one set of interleaved rounds (`_time_checks`).
        Where the probe's throughput misses the run-time line, below or above, the range ends at
        the largest timed batch size; where it held short of the range's end, at the probe
        (`range_checked`). Then the recommendation, from measurements alone
        (`recommend`; `headline`: the user's batch size timed alone). The rounds stop once they
        decide these comparisons (`comparisons_decided`); their cost is bounded (half the budget's
        `max_run_s` for the rounds, at least `min_blocks` blocks each), and a batch size is timed
        only where one iteration is predicted to take at most `max_run_s / min_blocks` (its minimum of blocks
        within the rounds' time: on a busy machine, the transformer example's probe at 105 samples,
        at 1.9 s predicted, had taken this step to 9.8 s)."""
        users = next(s for s in samples if s.batch_size == self.batch_size)
        budget = self.request.budget
        limit_ms = budget.max_run_s / budget.min_blocks * 1000

        def affordable(batch_size: int) -> bool:
            predicted = models.predict(batch_size).run_time_ms
            return predicted is not None and predicted <= limit_ms

        def suggestion() -> int | None:  # none to time where the models' times spread too much
            return None if too_noisy(samples) else candidate(models, self.batch_size).batch_size

        suggested = suggestion()
        probe = range_probe(models, suggested, affordable)
        if probe is None and range_probe(models, suggested, lambda batch_size: True) is not None:
            # The range would extend past the timed batch sizes, unchecked: it ends at the largest.
            models = dataclasses.replace(models, range_unprobed=True)
            suggested = suggestion()
        timed = {s.batch_size for s in samples}
        not_timed: dict[int, str] = {}
        wanted = {b for b in (suggested, probe) if b is not None and b not in timed}
        if suggested is not None and suggested in timed and suggested != self.batch_size and affordable(suggested):
            # Timed again beside yours though the models' rounds timed it: the latest rounds decide
            # (a small GPT's 8 was advised from the models' rounds while the confirming rounds had
            # timed the user's 16 faster than 8 had run there).
            wanted.add(suggested)
        if suggested in wanted and not affordable(suggested):
            seconds = (models.predict(suggested).run_time_ms or math.inf) / 1000
            not_timed[suggested] = (
                f"one iteration there is predicted to take {seconds:.1f} s, and {budget.min_blocks} of them "
                f"would overrun the {budget.max_run_s:g} s this step spends timing; profile with --batch-size "
                f"{suggested} to measure it"
            )
            wanted.discard(suggested)
        if not wanted:
            return Confirmed(models, recommendation=recommend(models, self.batch_size, samples, (), not_timed))

        def decided(timed: Mapping[int, Sample], errors: Mapping[int, float]) -> bool:
            return comparisons_decided(models, headline, suggested, probe, timed, errors)

        checks, notes = self._time_checks(runner, sorted(wanted), users, probing, not_timed, decided)
        models = dataclasses.replace(models, failing_batch_sizes=tuple(sorted(probing.failing)))
        by_size = {s.batch_size: s for s in checks}
        if probe in by_size and self.batch_size in by_size:
            models, missed = range_checked(models, by_size[self.batch_size], by_size[probe], ", timed beside yours,")
            notes.extend([missed] if missed else [])
        models = models.with_checks(checks)
        recommendation = recommend(models, self.batch_size, samples, checks, not_timed)
        return Confirmed(models, checks, recommendation, notes)

    def _time_checks(
        self,
        runner: IterationRunner,
        sizes: list[int],
        users: Sample,
        probing: Probing,
        not_timed: dict[int, str],
        decided: DecidedBy,
    ) -> tuple[list[Sample], list[str]]:
        """`sizes` measured (memory, then time) beside the user's batch size, timed together in
        interleaved rounds until `decided`; what could not be measured (out of memory, the user's
        code failing there: `probing` tells it) is left out, and `not_timed` says why."""
        notes: list[str] = []
        memory = {users.batch_size: users.memory}
        for batch_size in sizes:
            try:
                memory[batch_size] = probing.memory_of(
                    batch_size, f"measuring the memory of batch size {batch_size}", 0.92
                )
            except OutOfMemoryAtBatchSize:
                notes.append(f"Batch size {batch_size} ran out of memory: stay below it on this device.")
                not_timed[batch_size] = "it ran out of memory (see the warnings)"
            except UserCodeError as exc:  # at this batch size, the only one running (as a probe's, analysis/probing.py)
                probing.fails(batch_size, exc)
                not_timed[batch_size] = "your code fails there (see the warnings)"
        measured = [b for b in sizes if b in memory]
        if not measured:
            return [], notes
        checks, timing_notes = self._time_together(
            runner, [users.batch_size, *measured], users, memory, probing, confirming=decided
        )
        for batch_size in set(measured) - {s.batch_size for s in checks}:
            failed = batch_size in probing.failing
            not_timed[batch_size] = (
                "your code fails there (see the warnings)" if failed else "it ran out of memory (see the warnings)"
            )
        if len(checks) < 2:  # the user's alone: nothing was timed beside it
            checks = []
        return checks, notes + timing_notes

    def _time_alone(self, runner: IterationRunner, users: Sample) -> tuple[list[Sample], list[str]]:
        """The user's batch size timed in full, when no other is measured."""
        return self._time_together(runner, [users.batch_size], users, {users.batch_size: users.memory})

    def _time_together(
        self,
        runner: IterationRunner,
        sizes: list[int],
        users: Sample,
        memory: dict[int, MemoryProfile],
        probing: Probing | None = None,
        confirming: DecidedBy | None = None,
    ) -> tuple[list[Sample], list[str]]:
        """Every batch size timed in interleaved rounds until each is precise, for the budget's
        longest time for one batch size in all (timed together, each needs fewer blocks than
        alone: a burst of load no longer has to be waited out size by size); then, while the
        run-time line fits the estimates poorly, more rounds (see remeasure_while_poor_fit). A
        batch size that runs out of memory now is left out (the user's keeps its first timing), and so
        is one the user's code fails at now (a failure that depends on the iteration's state, which
        the probe did not meet), with what lies beyond it (`probing` tells the failure).
        `confirming`: the confirming step's batch sizes (`_confirm`), timed until the comparisons
        are decided (`confirming` says when, from the measurements so far), as they are (the line
        through them is no model's) and without a second note of a busy machine."""
        notes: list[str] = []
        budget = self.request.budget
        while True:
            what = "timing" if confirming is None else "confirming"
            self.progress(
                f"{what} batch sizes {', '.join(map(str, sizes))} together", 0.7 if confirming is None else 0.94
            )
            try:
                with CpuContention() as contention, runner.at_batch_sizes(sizes) as runs:
                    timing = runner.timing(runs)
                    if confirming is None:
                        timing.measure(budget.max_run_s)
                    else:  # the confirming rounds decide comparisons, not a line: half the time at most
                        timing.measure(budget.max_run_s / 2, _deciding(runner, users, memory, confirming))
                    micro_batches = _micro_batches(runner, users, [*sizes, users.batch_size])
                    if len(sizes) >= 3 and confirming is None:
                        remeasure_while_poor_fit(timing, budget.max_run_s * len(sizes), micro_batches)
                    runner.check_trained(max(sizes))
                break
            except OutOfMemoryAtBatchSize as exc:
                left_out = "; it is left out of the models" if confirming is None else ""
                notes.append(
                    f"Batch size {exc.batch_size} ran out of memory while timing{left_out}: "
                    "stay below it on this device (another process may hold some of its memory)."
                )
                sizes = [b for b in sizes if b != exc.batch_size]
                if sizes == [users.batch_size]:
                    return [users], notes
            except UserCodeError as exc:
                if probing is None or exc.batch_size is None or exc.batch_size == users.batch_size:
                    raise
                probing.fails(exc.batch_size, exc)
                sizes = [b for b in sizes if not beyond_a_failure(b, users.batch_size, probing.failing)]
                if sizes == [users.batch_size]:
                    return [users], notes
        self.busiest_rounds = busiest(self.busiest_rounds, contention)
        stats = timing.stats()
        samples = [Sample(b, stats[b], memory[b], micro_batches[b]) for b in sizes]
        if users.batch_size not in stats:
            samples.append(dataclasses.replace(users, micro_batches=micro_batches[users.batch_size]))
        busy = busy_machine_note(contention, "side by side, so the comparison between them holds better than")
        if busy and confirming is None:
            notes.append(busy)
        return sorted(samples, key=lambda s: s.batch_size), notes

    def _users_batch_size(self, runner: IterationRunner, creation: CreationSites) -> BatchSizeMeasurement:
        compiling = "compiling the model (torch.compile) and " if is_compiled(runner.model) else ""
        self.progress(f"{compiling}measuring batch size {self.batch_size}", 0.0)
        try:
            # Optimizers are found as they step, through all of it: one stepped every fifth call (a
            # GAN's generator) may not step in the warm-up.
            with runner.at_batch_size(self.batch_size) as run, creation.finding_optimizers(self.entry.relative_path):
                return measure_batch_size(
                    OneProcess(runner, run, self.batch_size),
                    IterationRecording(creation, runner.model, runner.device, runner.held_modules),
                    timeline=self.request.timeline,
                    on_first=lambda sample, found: self._send(sample, found, runner.notes),
                    growth_known_none=self.reuse.growth_known_none,
                )
        except OutOfMemoryAtBatchSize as exc:
            raise _does_not_fit(exc, self.device, self.location, self.request.memory_limit_source, self.entry) from None

    def _input_provider_line(self) -> str:
        return f"{self.entry.relative_path}:{self.entry.line_of(self.entry.input_provider)}"

    def _send(self, sample: Sample, breakdown: Breakdown, notes: list[str]) -> None:
        if self.partial is not None:
            self.partial(self.document(samples=[sample], breakdown=breakdown, models=None, warnings=notes))


def remeasure_while_poor_fit(
    timing: InterleavedTiming, max_s: float, micro_batches: Mapping[int, int] | None = None
) -> None:
    """Rounds doubled while the run-time line fits the estimates poorly, for at most `max_s`: a
    busy machine's noise is measured away, at a cost only where it bends the line. (Under two busy
    processes, 4 analyses of the default example each way, interleaved: R² 0.88-0.99 after one
    doubling, 0.93-1.00 after this; held-out errors 44-48 % with 2 withheld, against 1-43 % with 1
    withheld. A quiet machine rarely needs any.) The line is one micro-batch's (`micro_batches` at
    each batch size): with accumulation to a fixed number of samples per step, whole iterations
    take about as long at every batch size and no line fits them (they were timed for the whole
    budget, 6.7 s of an 8.2 s analysis)."""
    started = perf_counter()
    while _poor_fit(timing.stats(), micro_batches or {}) and (left := max_s - (perf_counter() - started)) > 0:
        timing.extend(left)


def _poor_fit(stats: dict[int, TimingStats], micro_batches: Mapping[int, int]) -> bool:
    return fits_poorly(fit_line(list(stats), [s.run_time_ms / micro_batches.get(b, 1) for b, s in stats.items()]))


def _deciding(
    runner: IterationRunner, users: Sample, memory: Mapping[int, MemoryProfile], confirming: DecidedBy
) -> Decided:
    """The confirming rounds' `decided` (measure/timing.py): `confirming`, asked of their estimates
    as measurements of each batch size, its memory and micro-batches with them."""

    def decided(stats: Mapping[int, TimingStats], errors: Mapping[int, float]) -> bool:
        micro = _micro_batches(runner, users, list(stats))
        return confirming({b: Sample(b, stats[b], memory[b], micro[b]) for b in stats}, errors)

    return decided


def _micro_batches(runner: IterationRunner, users: Sample, sizes: list[int]) -> dict[int, int]:
    """Gradient accumulation at each of `sizes`: the user's batch size's recording found its
    micro-batches (Recording.micro_batches); where the model ran once per micro-batch there, each
    other batch size has as many as the model's passes per call there. Accumulation to a fixed
    number of samples per step (k = 256 // batch_size) runs fewer at larger batch sizes: counted
    with the user's k, 16 samples' throughput was half what it is and 64's twice. One everywhere
    where the model ran more times per call at larger batch sizes than at smaller: a loop that
    splits its batch into chunks of a fixed size (`x.split(16)`) runs `batch_size` samples per
    step, not that many per chunk (its throughput was counted four times over)."""
    k = users.micro_batches
    if k > 1 and runner.model_calls_grow_with_batch_size():
        return dict.fromkeys(sizes, 1)
    if runner.passes_per_call(users.batch_size) != k:
        return dict.fromkeys(sizes, k)
    return {b: runner.passes_per_call(b) or k for b in sizes}


def batch_size_location(entry: EntryPoint) -> BatchSizeLocation | None:
    """Where the default of the input provider that ran lies in the text that was imported (reading
    the file again could see a later edit); None when that cannot be known."""
    try:
        code = entry.input_provider_code()
    except EntryPointError:
        return None  # the batch size is not the editor's to change; the analysis goes on
    return find_batch_size_location(entry.source, entry.relative_path, code)


def _check_batch_size(batch_size: int | None) -> None:
    if batch_size is None:
        return
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0:
        raise SkylineError(f"the batch size must be a positive integer, not {batch_size!r}.")


def _does_not_fit(
    exc: OutOfMemoryAtBatchSize,
    device: DeviceInfo,
    location: BatchSizeLocation | None,
    limit_source: str,
    entry: EntryPoint,
) -> OutOfMemory:
    """The error at the batch size's default (what to change), saying which memory ran out and
    where in the user's code the allocation failed; at that line when the default is unknown. Where
    iterations had run at that batch size before, memory grew with each (a leak): the error is at
    the allocation, and a smaller batch size is no advice (it would run out later)."""
    cause = exc.cause.rstrip(".")
    failed = f"the allocation at {exc.path}:{exc.line} failed ({cause})" if exc.path and exc.line else cause
    memory = _memory_that_ran_out(device, limit_source)
    if exc.iterations_before > 0:
        ran = f"{exc.iterations_before:,} iteration{'s' if exc.iterations_before != 1 else ''}"
        return OutOfMemory(
            f"batch size {exc.batch_size} ran {ran}, then ran out of {memory}: {failed}. Memory grew with "
            "every iteration, so a smaller batch size would run out too, only later.",
            path=exc.path or entry.relative_path,
            line=exc.line,
            hint="Keep no tensors across iterations (append `loss.item()`, not `loss`; `output.detach()`), then "
            "profile again.",
        )
    path, line = (location.path, location.line) if location else (exc.path or entry.relative_path, exc.line)
    return OutOfMemory(
        f"batch size {exc.batch_size} does not fit in {memory}: {failed}.",
        path=path,
        line=line,
        hint="Lower the batch size.",
    )


def _memory_that_ran_out(device: DeviceInfo, limit_source: str) -> str:
    """The device's memory, or this process's address-space limit when that is the smaller: on the
    CPU, an allocation fails at the limit long before the machine's memory is used up."""
    capacity = f"{device.memory_capacity_bytes / 2**30:.1f} GiB"
    limit = address_space_limit()
    if device.type == "cpu" and limit is not None and limit < device.memory_capacity_bytes:
        return (
            f"the memory limit of {limit / 2**30:.1f} GiB ({limit_source}), less than the {capacity} of {device.name}"
        )
    return f"the memory of {device.name} ({capacity})"
