"""One analysis of data-parallel training, on every rank:

join the process group → build the iteration with the model in DDP → the measurement sequence of
one batch size (analysis/sequence.py), its iterations a rank's (`_Rank`: memory with
communication, the breakdown recorded without it, DDP's `no_sync`, the iteration timed with and
without its all-reduces in interleaved blocks) → traced iterations (each bucket's all-reduce) →
the link, timed alone → rank 0 gathers every rank's measurements, attributes communication to
lines, predicts scaling and writes the document.

Every rank runs the same iterations and collectives in the same order (measure/distributed.py).
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import torch

from skyline_engine.analysis.assembly import build_document, with_output_note
from skyline_engine.analysis.data_parallel import Bucket, DataParallel, RankMeasurement
from skyline_engine.analysis.document import AnalysisDocument
from skyline_engine.analysis.sequence import IterationSource, measure_batch_size
from skyline_engine.analysis.session import (
    AnalysisRequest,
    Progress,
    batch_size_location,
    no_progress,
)
from skyline_engine.attribute.communication import BucketLines, ParameterCallSites, attribute_buckets
from skyline_engine.attribute.creation import CreationSites
from skyline_engine.attribute.frames import CallSites
from skyline_engine.attribute.recording import IterationRecording
from skyline_engine.entry.loader import EntryPoint, load_entry_point, resolve_entry_path
from skyline_engine.entry.user_output import first_lines_of_user_output
from skyline_engine.errors import OutOfMemory
from skyline_engine.measure.device import describe_device, torch_version
from skyline_engine.measure.distributed import (
    BucketTimer,
    BucketTiming,
    CommunicationTiming,
    Rank,
    agree,
    gather_to_first,
    link_description,
    lockstep_timing,
    measure_link,
    wrap_ddp,
)
from skyline_engine.measure.iteration import IterationRunner, OutOfMemoryAtBatchSize
from skyline_engine.measure.memory import MemoryProfile, cublas_workspace_bytes
from skyline_engine.measure.runtime import runtime_changes
from skyline_engine.measure.timing import TimingBudget, TimingStats
from skyline_engine.predict import scaling

# Iterations whose buckets are traced, after timing: their medians are reported.
TRACED_ITERATIONS = 5
MAX_ROUNDS = 30
# Times the link is measured while its all-reduces fit no link (see fit_measured_link).
LINK_ATTEMPTS = 3


def analyze_rank(request: AnalysisRequest, rank: Rank, progress: Progress = no_progress) -> AnalysisDocument | None:
    """This rank's part of the analysis; the document on rank 0, None on the others."""
    root = Path(request.project_root).resolve()
    path = resolve_entry_path(request.entry_point, root, request.base_dir)
    progress("loading the entry point", 0.0)
    entry = load_entry_point(path, root)
    try:
        with first_lines_of_user_output() as output:
            document = _RankAnalysis(request, entry, rank, progress).run()
    finally:
        entry.unload()
    return None if document is None else with_output_note(document, output)


NO_BATCH_SIZE_MODELS = (
    "Data-parallel training is measured at one batch size: every rank must run the same iterations and "
    "collectives, so batch-size models are not fitted. Profile one process (without --nproc) for them."
)


class _RankAnalysis:
    def __init__(self, request: AnalysisRequest, entry: EntryPoint, rank: Rank, progress: Progress) -> None:
        self.request = request
        self.entry = entry
        self.rank = rank
        self.progress = progress
        self.batch_size = request.batch_size or entry.default_batch_size

    def run(self) -> AnalysisDocument | None:
        self.progress("building the model", 0.05)
        creation = CreationSites(CallSites(self.entry.files))
        with creation.recording_modules():
            runner = IterationRunner(
                self.entry,
                self.rank.device,
                self.request.budget,
                wrap_model=lambda m: wrap_ddp(m, self.rank),
                find_steady_state=False,  # the ranks' iterations are collectives: none may wait alone
            )
        ddp = runner.model
        assert isinstance(ddp, torch.nn.parallel.DistributedDataParallel)
        timer = BucketTimer(ddp, self.rank.device)
        sites = ParameterCallSites(ddp.module, creation)
        with runner, self._at_batch_size(runner) as run, creation.finding_optimizers(self.entry.relative_path):
            source = _Rank(runner, run, ddp, self.batch_size, sites, self.progress)
            self.progress(f"warming up {self.rank.world_size} ranks", 0.1)
            measured = measure_batch_size(
                source,
                IterationRecording(creation, ddp.module, self.rank.device, runner.held_modules),
                timeline=self.request.timeline,
            )
            self.progress("timing each bucket's all-reduce", 0.8)
            traced = timer.traced(run)
            for _ in range(TRACED_ITERATIONS):
                traced()
            runner.check_trained(self.batch_size)
        self.progress("timing the link", 0.9)
        fitted_link = self._measured_link()
        sample, growth = measured.sample, measured.growth
        mine = RankMeasurement(self.rank.rank, sample.run_time_ms, source.compute_ms, sample.peak_memory_bytes)
        ranks = gather_to_first(mine)
        if ranks is None:
            return None
        communication = timer.timing()
        buckets, per_line = attribute_buckets(communication.buckets, ddp.module, sites)
        data_parallel, link_unfitted = self._data_parallel(ranks, communication, buckets, fitted_link)
        breakdown = measured.breakdown
        lines = [replace(line, communication_ms=per_line.get((line.path, line.line), 0.0)) for line in breakdown.lines]
        # Measured once nothing is measured any more: it frees them.
        breakdown = replace(breakdown, lines=lines).with_workspaces(cublas_workspace_bytes(self.rank.device))
        recorded = breakdown.attribution.recorded_iterations
        differing = runner.work_at(self.batch_size).warning(recorded)
        self.progress("done", 1.0)
        return build_document(
            project_root=str(self.entry.files.root),
            entry_point=self.entry.relative_path,
            torch_version=torch_version(),
            device=describe_device(self.rank.device, self.request.memory_capacity_bytes),
            batch_size=self.batch_size,
            samples=[sample],
            breakdown=breakdown,
            models=None,
            batch_size_location=batch_size_location(self.entry),
            warnings=[
                *([differing] if differing else []),
                *measured.warnings(),
                *data_parallel_notes(data_parallel, link_unfitted),
            ],
            distributed=data_parallel,
            breakdown_time_ms=max(1e-9, sample.run_time_ms - sum(per_line.values())),
            models_withheld=NO_BATCH_SIZE_MODELS,
            memory_growth=growth,
            runtime_changes=runtime_changes(os.environ, runner.malloc_pinned),
        )

    def _data_parallel(
        self,
        ranks: list[RankMeasurement],
        communication: CommunicationTiming,
        buckets: list[BucketLines],
        fitted_link: scaling.Link | str | None,
    ) -> tuple[DataParallel, bool]:
        """The data-parallel part of the document, with its scaling predictions; whether no link
        fitted the measured all-reduces (then none is planned for either, as the calibration to
        the measured iteration needs the measured link)."""
        measured_link = fitted_link if isinstance(fitted_link, scaling.Link) else None
        link_unfitted = isinstance(fitted_link, str)
        data_parallel = DataParallel(
            world_size=self.rank.world_size,
            backend=self.rank.backend,
            threads_per_rank=torch.get_num_threads(),
            ranks=ranks,
            buckets=[
                Bucket(t.index, t.size_bytes, b.parameter_names, t.ready_ms, t.all_reduce_ms, t.exposed_ms, b.lines)
                for t, b in zip(communication.buckets, buckets)
            ],
            link=None if link_unfitted else self._planned_link(measured_link),
            scaling=[],
            backward_end_ms=communication.backward_end_ms,
        )
        with_scaling = self._with_scaling(
            data_parallel, measured_link, communication.backward_end_ms, communication.buckets
        )
        return with_scaling, link_unfitted

    @contextlib.contextmanager
    def _at_batch_size(self, runner: IterationRunner) -> Iterator[Callable[[], None]]:
        try:
            with runner.at_batch_size(self.batch_size) as run:
                yield run
        except OutOfMemoryAtBatchSize as exc:
            raise OutOfMemory(
                f"batch size {exc.batch_size} does not fit in the memory of rank {self.rank.rank}'s device "
                f"({exc.cause.rstrip('.')}).",
                path=exc.path or self.entry.relative_path,
                line=exc.line,
                hint="Lower the batch size.",
            ) from None

    def _measured_link(self) -> scaling.Link | str | None:
        """The link between the ranks, fitted to its all-reduces; why none fits them; None on one
        rank, which has no link to measure."""
        if self.rank.world_size == 1:
            return None
        return fit_measured_link(lambda: measure_link(self.rank), link_description(self.rank))

    def _planned_link(self, measured: scaling.Link | None) -> scaling.Link | None:
        """The link the scaling plans for: the planned one (--interconnect-gbps), else the measured
        one."""
        gbps = self.request.interconnect_gbps
        if measured is None:  # one rank: nothing to calibrate against
            no_latency = scaling.Link(0.0, 1.0, "user", "")
            return scaling.planned_link(gbps, no_latency) if gbps else None
        return scaling.planned_link(gbps, measured) if gbps else measured

    def _with_scaling(
        self,
        data_parallel: DataParallel,
        measured_link: scaling.Link | None,
        backward_end_ms: float,
        buckets: list[BucketTiming],
    ) -> DataParallel:
        """The scaling predictions, calibrated to the iteration measured here: against the link
        measured here, so that on that link the prediction at this world size is the measurement,
        and a planned link keeps what synchronising cost beyond the all-reduces."""
        if data_parallel.link is None:
            return data_parallel
        compute_ms = data_parallel.ranks[data_parallel.slowest_rank].compute_ms
        timings = [scaling.BucketTiming(b.index, b.size_bytes, b.ready_ms, b.all_reduce_ms) for b in buckets]
        iteration_ms = max(r.run_time_ms for r in data_parallel.ranks)  # the ranks wait for each other
        world_size = self.rank.world_size
        calibration = 0.0
        if measured_link is not None:
            calibration = scaling.calibration_ms(
                measured_iteration_ms=iteration_ms,
                compute_ms=compute_ms,
                backward_end_ms=backward_end_ms,
                buckets=timings,
                link=measured_link,
                measured_world_size=world_size,
            )
        rows = scaling.predict_scaling(
            compute_ms=compute_ms,
            backward_end_ms=backward_end_ms,
            buckets=timings,
            link=data_parallel.link,
            batch_size_per_rank=self.batch_size,
            measured_world_size=world_size,
            measured_samples_per_second=world_size * self.batch_size / iteration_ms * 1000.0,
            calibration_ms=calibration,
        )
        return replace(data_parallel, scaling=rows)


class _Rank(IterationSource):
    """A rank's iterations for the measurement sequence. Every rank runs the same iterations and
    collectives in the same order, so what decides how many is rank 0's (`agree`): the
    iteration's time for the timing plan, and the cycle of calls, which is read from the calls
    seen and never sought by running more. The iteration is recorded without communication
    (DDP's `no_sync`), so that its operations are the model's; memory is measured apart, with
    communication, as training runs; timing interleaves blocks with and without communication,
    the difference being the communication a line waits for. One recorded iteration: more would
    be counted by each rank's own time."""

    records_more = False

    def __init__(
        self,
        runner: IterationRunner,
        run: Callable[[], None],
        ddp: torch.nn.parallel.DistributedDataParallel,
        batch_size: int,
        sites: ParameterCallSites,
        progress: Progress,
    ) -> None:
        self.runner = runner
        self.run = run
        self.ddp = ddp
        self.batch_size = batch_size
        self.sites = sites
        self.progress = progress
        self.clock = runner.clock
        self.live_tensors = runner.live_tensors
        self.compute_ms = math.nan  # the iteration without communication, once timed
        self._iteration_ms: float | None = None  # rank 0's, past one-off costs

    @property
    def compiled(self) -> bool:
        return self.runner.compilation is not None

    def warm_up(self) -> float:
        return self.runner.warm_up(self.run)

    def run_recorded(self) -> None:
        with self.ddp.no_sync():
            self.run()

    def memory(self) -> MemoryProfile | None:
        return self.runner.memory(self.run)

    def watching_first(self) -> contextlib.AbstractContextManager[None]:
        self.progress("recording the breakdown", 0.2)
        return self.sites.watching()

    def time(self) -> TimingStats:
        self.progress("timing the iteration with and without communication", 0.3)
        if self._iteration_ms is None:
            self._iteration_ms = agree(min(self.clock.time_ms(self.run) for _ in range(3)))
        block_size, rounds = _timing_plan(self._iteration_ms, self.runner.budget, self.runner.cycle)
        stats = lockstep_timing({"ddp": self.run, "no_sync": self.run_recorded}, self.clock, block_size, rounds)
        self.compute_ms = stats["no_sync"].run_time_ms
        return stats["ddp"]

    def recorded_run_time_ms(self, timing: TimingStats) -> float:
        return self.compute_ms

    def measure_in_cycles(self, run_time_ms: float) -> int | None:
        assert self._iteration_ms is not None  # timed before
        cycle = agree(self.runner.work_at(self.batch_size).cycle() or 1)  # every rank measures the same calls
        if not self.runner.measure_in_cycles(cycle, self.batch_size, self._iteration_ms):
            return None
        self.progress(f"measuring whole cycles of {cycle} calls", 0.6)
        return cycle

    def align_to_cycle(self) -> None:
        self.runner.align_to_cycle(self.run_recorded)


def _timing_plan(iteration_ms: float, budget: TimingBudget, cycle: int = 1) -> tuple[int, int]:
    """Blocks of at least the budget's block time (of whole cycles of `cycle` calls, where calls
    differ), and as many rounds (one block with and one without communication each) as fit the
    budget's longest time, within [min_blocks, MAX_ROUNDS]."""
    iteration_ms = max(iteration_ms, 1e-3)
    block_size = math.ceil(max(1, math.ceil(budget.min_block_ms / iteration_ms)) / cycle) * cycle
    rounds = int(budget.max_run_s * 1000 / (2 * block_size * iteration_ms))
    return block_size, max(budget.min_blocks, min(MAX_ROUNDS, rounds))


def fit_measured_link(
    measure: Callable[[], list[tuple[int, int, float]]],
    description: str,
    attempts: int = LINK_ATTEMPTS,
    decide: Callable[[bool], bool] = agree,
) -> scaling.Link | str:
    """The link fitted to `measure`'s all-reduces, or why none fits.

    A busy machine can slow a small all-reduce past a large one, and then no positive bandwidth
    fits; the link is measured again, up to `attempts` times. `measure` is collective, so every
    rank must measure as often: `decide` gives every rank rank 0's verdict on measuring again.
    """
    fitted: scaling.Link | str = "the link was not measured"
    for _ in range(attempts):
        try:
            fitted = scaling.fit_link(measure(), description)
        except ValueError as exc:
            fitted = str(exc)
        if not decide(isinstance(fitted, str)):
            break
    return fitted


def data_parallel_notes(data_parallel: DataParallel, link_unfitted: bool = False) -> list[str]:
    notes = [
        "Batch-size predictions are not made for data-parallel training: profile without --nproc for them; "
        "`batch_size` and `iteration` are per rank."
    ]
    link = data_parallel.link
    if link_unfitted:
        notes.append(
            f"The link's all-reduces did not take longer as they grew, in {LINK_ATTEMPTS} tries (other processes "
            "using the cores can do that), so no link fits them and no scaling is predicted: profile again on a "
            "quieter machine."
        )
    elif link is None:
        notes.append(
            "One rank has no link to measure, so no scaling is predicted: run with --nproc 2 or more, or give "
            "--interconnect-gbps to plan for a link."
        )
    elif link.source == "measured" and "loopback" in link.description:
        notes.append(
            "The all-reduces ran over loopback between processes sharing this machine's cores: the scaling "
            "predictions plan for that link; give --interconnect-gbps to plan for a real one."
        )
    return notes
