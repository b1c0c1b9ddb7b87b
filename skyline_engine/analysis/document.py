"""The analysis document: plain data (JSON-ready), the one thing every renderer and the editor read.

Its fields are documented in docs/analysis-document.md; add fields freely, never rename them.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

import skyline_engine
from skyline_engine.entry.batch_size import BatchSizeLocation
from skyline_engine.measure.device import DeviceInfo
from skyline_engine.measure.iteration import Sample
from skyline_engine.predict.batch_models import BatchSizeModels

SCHEMA = "skyline.analysis/1"


def build_document(
    *,
    project_root: str,
    entry_point: str,
    device: DeviceInfo,
    batch_size: int,
    samples: Sequence[Sample],
    models: BatchSizeModels | None,
    batch_size_location: BatchSizeLocation | None,
    warnings: list[str],
) -> dict:
    measured = next(s for s in samples if s.batch_size == batch_size)
    document = {
        "schema": SCHEMA,
        "engine_version": skyline_engine.__version__,
        "torch_version": torch.__version__,
        "project_root": project_root,
        "entry_point": entry_point,
        "device": device.to_dict(),
        "batch_size": batch_size,
        "iteration": {
            "run_time_ms": measured.run_time_ms,
            "run_time_iqr_ms": measured.timing.iqr_ms,
            "repetitions": measured.timing.iterations,
            "samples_per_second": batch_size / measured.run_time_ms * 1000.0,
            "peak_memory_bytes": measured.peak_memory_bytes,
        },
        "models": _models(samples, models),
        "predictions": _predictions(batch_size, models, samples),
        "batch_size_location": batch_size_location.to_dict() if batch_size_location else None,
        "warnings": list(warnings),
    }
    document.update(measured.breakdown or EMPTY_BREAKDOWN)
    return document


# The breakdown's fields when there is none, so that readers find every documented field.
EMPTY_BREAKDOWN = {"lines": [], "operations": None, "weights": [], "optimizer_state": [], "untracked": None}


def _models(samples: Sequence[Sample], models: BatchSizeModels | None) -> dict | None:
    if models is None:
        return None
    return {"samples": [s.to_dict() for s in samples], **models.to_dict()}


def prediction_batch_sizes(batch_size: int, measured: Sequence[int], largest: int | None) -> list[int]:
    """Batch sizes worth showing: the user's, every measured one, powers of two from the smallest
    measured up to 16 times the user's, and the largest that fits; none above the largest that
    fits but the measured ones."""
    smallest = min(measured)
    upper = min(largest, batch_size * 16) if largest else batch_size * 16
    sizes = {batch_size, *measured}
    step = 1
    while step <= upper:
        if step >= smallest:
            sizes.add(step)
        step *= 2
    if largest:
        sizes.add(largest)
    return sorted(s for s in sizes if largest is None or s <= largest or s == batch_size or s in measured)


def _predictions(batch_size: int, models: BatchSizeModels | None, samples: Sequence[Sample]) -> list[dict]:
    """The ladder's predictions; a measured batch size also carries its measurement, which is
    what a reader shows for it (the line through the samples does not pass through each)."""
    if models is None:
        return []
    measured = {s.batch_size: s for s in samples}
    sizes = prediction_batch_sizes(batch_size, list(measured), models.max_batch_size())
    return [
        {**models.predict(b).to_dict(), "measured": _measurement(measured[b]) if b in measured else None} for b in sizes
    ]


def _measurement(sample: Sample) -> dict:
    return {
        "run_time_ms": sample.run_time_ms,
        "samples_per_second": sample.batch_size / sample.run_time_ms * 1000.0,
        "peak_memory_bytes": sample.peak_memory_bytes,
    }
