"""The analysis document: plain data (JSON-ready), the one thing every renderer and the editor read.

Its fields are documented in docs/analysis-document.md; add fields freely, never rename them.
"""

from __future__ import annotations

from typing import List, Optional, Sequence

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
    models: Optional[BatchSizeModels],
    batch_size_location: Optional[BatchSizeLocation],
    warnings: List[str],
) -> dict:
    measured = next(s for s in samples if s.batch_size == batch_size)
    return {
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
        "predictions": _predictions(batch_size, models),
        "batch_size_location": batch_size_location.to_dict() if batch_size_location else None,
        "warnings": list(warnings),
    }


def _models(samples: Sequence[Sample], models: Optional[BatchSizeModels]) -> Optional[dict]:
    if models is None:
        return None
    return {"samples": [s.to_dict() for s in samples], **models.to_dict()}


def prediction_batch_sizes(batch_size: int, max_batch_size: Optional[int]) -> List[int]:
    """A ladder of batch sizes worth showing: powers of two around the user's, theirs, and the
    largest that fits."""
    upper = max_batch_size if max_batch_size else batch_size * 16
    sizes = {batch_size}
    step = 1
    while step <= upper:
        if batch_size // 4 <= step <= batch_size * 16:
            sizes.add(step)
        step *= 2
    if max_batch_size:
        sizes.add(max_batch_size)
    return sorted(s for s in sizes if s >= 1 and (max_batch_size is None or s <= max_batch_size or s == batch_size))


def _predictions(batch_size: int, models: Optional[BatchSizeModels]) -> List[dict]:
    if models is None:
        return []
    return [models.predict(bs).to_dict() for bs in prediction_batch_sizes(batch_size, models.max_batch_size())]
