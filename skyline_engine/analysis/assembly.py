"""The analysis document assembled from what an analysis measured: the breakdown fitted to the
iteration, the models' predictions over the ladder of batch sizes, and what to know about the
breakdown first among the warnings. The document's shape is analysis/document.py."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from skyline_engine.analysis.breakdown_notes import breakdown_notes
from skyline_engine.analysis.data_parallel import DataParallel
from skyline_engine.analysis.document import AnalysisDocument, PredictionRow
from skyline_engine.analysis.known_memory import Reused
from skyline_engine.attribute.breakdown import Breakdown
from skyline_engine.attribute.memory_growth import MemoryGrowth
from skyline_engine.entry.batch_size import BatchSizeLocation
from skyline_engine.entry.user_output import UserOutput
from skyline_engine.measure.compilation import Compilation
from skyline_engine.measure.device import DeviceInfo
from skyline_engine.measure.iteration import Sample
from skyline_engine.measure.memory import MemoryProfile
from skyline_engine.measure.runtime import runtime_note
from skyline_engine.predict.batch_models import BatchSizeModels, prediction_ladder
from skyline_engine.predict.recommendation import (
    Recommendation,
    beside_your_headline,
    in_your_trainings_state,
    malloc_states,
    recommend,
)


def build_document(
    *,
    project_root: str,
    entry_point: str,
    torch_version: str,
    device: DeviceInfo,
    batch_size: int,
    samples: Sequence[Sample],
    breakdown: Breakdown,
    models: BatchSizeModels | None,
    batch_size_location: BatchSizeLocation | None,
    warnings: list[str],
    memory_only: dict[int, MemoryProfile] | None = None,
    distributed: DataParallel | None = None,
    breakdown_time_ms: float | None = None,
    compilation: Compilation | None = None,
    models_withheld: str | None = None,
    memory_growth: MemoryGrowth | None = None,
    runtime_changes: list[str] | None = None,
    checks: Sequence[Sample] = (),
    recommendation: Recommendation | None = None,
    iteration: Sample | None = None,
    script: bool = False,
    reused: Reused | None = None,
) -> AnalysisDocument:
    """The document of an analysis at `batch_size` (which `samples` must hold), with the models'
    predictions over the ladder of batch sizes when there are models. The breakdown is fitted to
    `breakdown_time_ms` when given (data-parallel training: the iteration less its exposed
    communication), else to the iteration's time; the warnings start with what to know about the
    breakdown as fitted, and end with what the engine changed in the runtime (`runtime_changes`,
    measure/runtime.py). `checks`: batch sizes timed beside the user's after the models were
    fitted (analysis/session.py, the confirming step), a prediction's measurement where no sample
    is; `recommendation` the one made from them, else the one the models and measurements make
    (predict/recommendation.py). `iteration`: the user's batch size as the document's `iteration`,
    where it is not its sample in `samples` (timed alone, before any other batch size ran).
    `script`: the document of a training script (the breakdown's notes advise for one). `reused`:
    what was taken from the previous analysis of the same code (analysis/known_memory.py)."""
    measured = {s.batch_size: s for s in samples}
    headline = iteration or measured[batch_size]
    fitted = breakdown.fitted_to(breakdown_time_ms or headline.run_time_ms)
    predictions = []
    states = None
    if models is not None:
        # The user's batch size shows the document's iteration, as every front end's headline does.
        shown = {**{s.batch_size: s for s in checks}, **measured, batch_size: headline}
        ladder = prediction_ladder(batch_size, sorted(shown), models.max_batch_size(), models.failing_batch_sizes)
        predictions = [PredictionRow(models.predict(b), shown.get(b)) for b in ladder]
        if recommendation is None:
            recommendation = recommend(models, batch_size, samples, checks)
        recommendation = beside_your_headline(recommendation, headline)
        # The user's batch size as the recommendation compared it: from the confirming rounds, else the models'.
        states = malloc_states(headline, {**measured, **{s.batch_size: s for s in checks}}[batch_size])
        recommendation = in_your_trainings_state(recommendation, states, [*samples, *checks])
    return AnalysisDocument(
        project_root=project_root,
        entry_point=entry_point,
        torch_version=torch_version,
        device=device,
        batch_size=batch_size,
        iteration=headline,
        breakdown=fitted,
        batch_size_location=batch_size_location,
        warnings=[
            *breakdown_notes(fitted, on_gpu=device.torch_device.type == "cuda", script=script),
            *warnings,
            *([states.warning()] if states and states.shows else []),
            *([note] if (note := runtime_note(runtime_changes or [])) else []),
        ],
        samples=sorted(samples, key=lambda s: s.batch_size),
        models=models,
        predictions=predictions,
        memory_only=dict(memory_only or {}),
        distributed=distributed,
        compilation=compilation,
        models_withheld=models_withheld,
        memory_growth=memory_growth,
        runtime_changes=list(runtime_changes or []),
        checks=sorted(checks, key=lambda s: s.batch_size) if models is not None else [],
        recommendation=recommendation if models is not None else None,
        reused=reused,
    )


def with_output_note(document: AnalysisDocument, output: UserOutput) -> AnalysisDocument:
    """The document, warning of the user's output that was not shown."""
    note = output.note()
    return document if note is None else dataclasses.replace(document, warnings=[*document.warnings, note])
