"""The analysis document: typed parts, and one `to_dict` that writes the JSON-ready data every
renderer, the service and the editor read.

Its fields are documented in docs/analysis-document.md (tests/test_document_fields.py keeps the
two in step); add fields freely, never rename them.

Importing this module imports no torch and no numpy (tests/test_architecture.py): the measurement
types are named for the type checker alone; `build_document` (analysis/assembly.py) is what needs
them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import skyline_engine

if TYPE_CHECKING:  # each imports torch or numpy
    from skyline_engine.analysis.data_parallel import DataParallel
    from skyline_engine.attribute.breakdown import Breakdown
    from skyline_engine.attribute.memory_growth import MemoryGrowth
    from skyline_engine.entry.batch_size import BatchSizeLocation
    from skyline_engine.measure.compilation import Compilation
    from skyline_engine.measure.device import DeviceInfo
    from skyline_engine.measure.iteration import Sample
    from skyline_engine.measure.memory import MemoryProfile
    from skyline_engine.predict.batch_models import BatchSizeModels, Prediction

SCHEMA = "skyline.analysis/1"


@dataclass(frozen=True)
class PredictionRow:
    """The models' prediction at one batch size, and its measurement when it was measured."""

    prediction: Prediction
    measured: Sample | None

    def to_dict(self) -> dict[str, Any]:
        return {**self.prediction.to_dict(), "measured": self.measured.to_dict() if self.measured else None}


@dataclass(frozen=True)
class AnalysisDocument:
    project_root: str
    entry_point: str
    torch_version: str
    device: DeviceInfo
    batch_size: int
    iteration: Sample  # at `batch_size`
    breakdown: Breakdown  # of an iteration at `batch_size`
    batch_size_location: BatchSizeLocation | None
    warnings: list[str]
    samples: list[Sample]  # every batch size measured, by batch size
    models: BatchSizeModels | None  # None in a partial document, or when fewer than two fit
    predictions: list[PredictionRow]
    memory_only: dict[int, MemoryProfile]  # batch sizes probed for the memory model alone
    distributed: DataParallel | None = None  # data-parallel training (--nproc, torchrun)
    compilation: Compilation | None = None  # what torch.compile compiled, apart from the iteration
    models_withheld: str | None = None  # why a complete document has no models
    memory_growth: MemoryGrowth | None = None  # tensor memory each iteration keeps for good (a leak)

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "engine_version": skyline_engine.__version__,
            "torch_version": self.torch_version,
            "project_root": self.project_root,
            "entry_point": self.entry_point,
            "device": self.device.to_dict(),
            "batch_size": self.batch_size,
            "iteration": self.iteration.to_dict(),
            "models": self._models(),
            "models_withheld": self.models_withheld,
            "predictions": [row.to_dict() for row in self.predictions],
            "batch_size_location": self.batch_size_location.to_dict() if self.batch_size_location else None,
            "warnings": list(self.warnings),
            "distributed": self.distributed.to_dict() if self.distributed else None,
            "compilation": self.compilation.to_dict() if self.compilation else None,
            "memory_growth": self.memory_growth.to_dict() if self.memory_growth else None,
            **self.breakdown.to_dict(),
        }

    def _models(self) -> dict[str, Any] | None:
        if self.models is None:
            return None
        return {
            "samples": [s.to_dict() for s in self.samples],
            "memory_samples": [
                {"batch_size": b, "peak_memory_bytes": p.peak_bytes, "peak_memory_phase": p.peak_phase}
                for b, p in sorted(self.memory_only.items())
            ],
            **self.models.to_dict(),
        }
