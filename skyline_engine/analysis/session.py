"""One analysis, end to end: load the entry point → measure → fit the batch-size models → document."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from skyline_engine.analysis.document import build_document
from skyline_engine.analysis.probing import Probing
from skyline_engine.entry.batch_size import find_batch_size_location
from skyline_engine.entry.loader import load_entry_point, resolve_entry_path
from skyline_engine.errors import OutOfMemory, SkylineError
from skyline_engine.measure.device import describe_device, resolve_device
from skyline_engine.measure.iteration import IterationRunner, OutOfMemoryAtBatchSize
from skyline_engine.measure.timing import TimingBudget
from skyline_engine.predict.batch_models import BatchSizeModels, usable_memory_bytes

Progress = Callable[[str, float], None]
Partial = Callable[[dict], None]


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


def analyze(request: AnalysisRequest, progress: Progress = no_progress, partial: Partial | None = None) -> dict:
    """Run one analysis and return its document.

    `partial`, when given, receives early documents (`models` null, `predictions` empty): the
    first as soon as one iteration at the user's batch size is broken down (its time from that
    one iteration, `repetitions` 1), then, when predicting, the user's batch size timed in full,
    before the other batch sizes are probed.
    """
    _check_batch_size(request.batch_size)
    root = Path(request.project_root).resolve()
    path = resolve_entry_path(request.entry_point, root, request.base_dir)
    progress("loading the entry point", 0.0)
    device = resolve_device(request.device)
    device_info = describe_device(device)
    entry = load_entry_point(path, root)
    try:
        batch_size = request.batch_size or entry.default_batch_size
        # The text that was imported: reading the file again could see a later edit.
        location = find_batch_size_location(entry.source, entry.relative_path)
        document = functools.partial(
            build_document,
            project_root=str(root),
            entry_point=entry.relative_path,
            device=device_info,
            batch_size=batch_size,
            batch_size_location=location,
        )
        progress("building the model", 0.0)
        runner = IterationRunner(entry, device, request.budget)
        probing = Probing(runner, usable_memory_bytes(device_info.memory_capacity_bytes), progress)

        def send(sample, notes):
            if partial is not None:
                partial(document(samples=[sample], models=None, warnings=notes))

        with runner:
            try:
                first = probing.measure_users(
                    batch_size,
                    timeline=request.timeline,
                    on_breakdown=lambda sample: send(sample, _breakdown_notes(sample.breakdown)),
                )
            except OutOfMemoryAtBatchSize as exc:
                raise _does_not_fit(exc, device_info, location, entry.relative_path) from None
            notes = _breakdown_notes(first.breakdown)
            if request.predict:
                send(first, notes)
                samples = probing.measure_others(batch_size)
                progress("fitting the batch-size models", 0.95)
                models = _fit_models(samples, device_info)
                warnings = notes + probing.notes + (models.warnings() if models else [ONE_SAMPLE])
            else:
                samples, models, warnings = [first], None, notes
        complete = document(samples=samples, models=models, warnings=warnings)
    finally:
        entry.unload()
    progress("done", 1.0)
    return complete


ONE_SAMPLE = "Only one batch size could be measured, so nothing is predicted."

# Below this, the recorded operations ran notably slower than the measured iteration.
NOTABLE_SCALING = 0.8


# Below this share of the iteration on user lines, the breakdown says where the rest may be.
LOW_ATTRIBUTION = 0.5


def _breakdown_notes(breakdown: dict) -> list:
    notes = []
    attribution = breakdown["attribution"]
    scale = attribution["scaled_by"]
    if scale < NOTABLE_SCALING:
        notes.append(
            f"Operations ran {1 / scale - 1:.0%} slower while recorded than in the measured iteration "
            "(recording adds work around each operation, a busy machine more); the per-line times "
            "were scaled down to the measured iteration."
        )
    share = attribution["user_lines_fraction"]
    if share is not None and share < LOW_ATTRIBUTION:
        notes.append(
            f"Only {share:.0%} of the iteration's time is in operations attributed to your lines; the "
            "rest (untracked) is Python work between operations, or work on other threads, which "
            "the breakdown does not see."
        )
    return notes


def _fit_models(samples, device_info) -> BatchSizeModels | None:
    if len(samples) < 2:
        return None
    return BatchSizeModels.fit(
        [s.batch_size for s in samples],
        [s.run_time_ms for s in samples],
        [s.peak_memory_bytes for s in samples],
        device_info.memory_capacity_bytes,
    )


def _check_batch_size(batch_size: int | None) -> None:
    if batch_size is None:
        return
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0:
        raise SkylineError(f"the batch size must be a positive integer, not {batch_size!r}.")


def _does_not_fit(exc: OutOfMemoryAtBatchSize, device, location, entry_path: str) -> OutOfMemory:
    path = location.path if location else entry_path
    line = location.line if location else None
    return OutOfMemory(
        f"batch size {exc.batch_size} does not fit in the memory of {device.name} "
        f"({device.memory_capacity_bytes / 2**30:.1f} GiB): {exc.__str__().split(': ', 1)[-1]}",
        path=path,
        line=line,
        hint="Lower the batch size.",
    )
