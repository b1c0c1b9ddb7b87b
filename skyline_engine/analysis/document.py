"""The analysis document: its shape on the wire, declared once, and the typed parts that write it.

The JSON-ready data every renderer, the service and the editor read is `DocumentDict` and the
TypedDicts below it, one for each object of docs/analysis-document.md, named after the fields
they hold; `AnalysisDocument.to_dict` writes it from the measurement types (a `Sample`, a
`Breakdown`, the batch-size models), each part through its own `to_dict` and declared here as
what it writes. tests/test_document_fields.py keeps the three in step: every field documented is
declared and written, every document the engine writes has the declared shape, value types
included. Add fields freely, never rename them (clients read them).

Importing this module imports no torch and no numpy (tests/test_architecture.py): a reader of
documents needs only their shape. The measurement types are named for the type checker alone;
`build_document` (analysis/assembly.py) is what needs them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, TypedDict, cast

import skyline_engine
from skyline_engine.vocabulary import OperationPhase, PeakPhase

if TYPE_CHECKING:  # each imports torch or numpy
    from skyline_engine.analysis.data_parallel import DataParallel
    from skyline_engine.analysis.known_memory import Reused
    from skyline_engine.attribute.breakdown import Breakdown
    from skyline_engine.attribute.memory_growth import MemoryGrowth
    from skyline_engine.entry.batch_size import BatchSizeLocation
    from skyline_engine.measure.compilation import Compilation
    from skyline_engine.measure.device import DeviceInfo
    from skyline_engine.measure.iteration import Sample
    from skyline_engine.measure.memory import MemoryProfile
    from skyline_engine.predict.batch_models import BatchSizeModels, Prediction
    from skyline_engine.predict.recommendation import Recommendation

SCHEMA = "skyline.analysis/1"


# --- the shape on the wire (docs/analysis-document.md, a TypedDict per table) ------------------


class DeviceDict(TypedDict):
    """`device`."""

    type: str  # "cpu" or "cuda"
    index: int | None
    name: str
    memory_capacity_bytes: int
    memory_capacity_source: str  # "user", "cuda", "nvml", "system_available", "cgroup", "physical_memory"


class MeasurementDict(TypedDict):
    """A measurement: `iteration`, `models.samples[]`, `predictions[].measured`."""

    batch_size: int
    run_time_ms: float
    run_time_iqr_ms: float
    repetitions: int
    samples_per_second: float
    micro_batches: int
    peak_memory_bytes: int
    peak_memory_phase: PeakPhase
    peak_memory_reserved_bytes: int | None
    page_faults_per_iteration: float | None


class LineFitDict(TypedDict):
    """A line: `models.run_time_ms`, and the fields `models.peak_memory_bytes` shares with it."""

    slope: float
    bias: float
    r2: float | None
    max_relative_residual: float
    points: int


class PhaseCurveDict(TypedDict):
    """`models.peak_memory_bytes.phases[]` (predict/peak_memory.py, PhaseCurve)."""

    name: PeakPhase
    slope: float
    bias: float
    r2: float | None
    quadratic: float


class PeakMemoryModelDict(LineFitDict):
    """`models.peak_memory_bytes`: a line's fields (of the curve that decides `max_batch_size`) and its own."""

    quadratic: float
    phases: list[PhaseCurveDict]
    fitted: str  # "per_operation" or "per_phase"
    phase_at_max_batch_size: PeakPhase | None


class MemorySampleDict(TypedDict):
    """`models.memory_samples[]`."""

    batch_size: int
    peak_memory_bytes: int
    peak_memory_phase: PeakPhase


class RecommendationDict(TypedDict):
    """`models.recommendation` (predict/recommendation.py, Recommendation)."""

    batch_size: int | None
    samples_per_second: float | None
    measured: bool
    reason: str
    users_samples_per_second: float | None
    timed: str


class ModelsDict(TypedDict):
    """`models`."""

    samples: list[MeasurementDict]
    memory_samples: list[MemorySampleDict]
    checks: list[MeasurementDict]
    recommendation: RecommendationDict
    run_time_ms: LineFitDict
    peak_memory_bytes: PeakMemoryModelDict
    memory_headroom_fraction: float
    micro_batches: int
    samples_per_step: int | None
    usable_memory_bytes: int
    max_batch_size: int | None
    max_batch_size_extrapolated: bool
    trusted_range: list[int]  # [low, high]
    failing_batch_sizes: list[int]
    line_bends_at: int | None
    range_unprobed: bool
    range_probed_to: int | None
    throughput_knee_batch_size: int | None
    throughput_knee_samples_per_second: float | None
    best_batch_size: int | None
    predicted_max_samples_per_second: float | None
    asymptotic_samples_per_second: float | None


class PredictionDict(TypedDict):
    """`predictions[]`."""

    batch_size: int
    run_time_ms: float | None
    samples_per_second: float | None
    peak_memory_bytes: float
    fits: bool
    extrapolated: bool
    measured: MeasurementDict | None


class BatchSizeLocationDict(TypedDict):
    """`batch_size_location`."""

    path: str
    line: int
    col_start: int
    col_end: int
    editable: bool
    value: int | None
    reason: str | None


class FrameDict(TypedDict):
    """A frame: `operations.contexts[]`, `weights[].contexts[]`, `optimizer_state[].contexts[]`,
    `distributed.buckets[].lines[]`."""

    path: str
    line: int


class PhaseTimesDict(TypedDict):
    """`lines[].inclusive`."""

    forward_ms: float
    backward_ms: float
    step_ms: float


class LineDict(TypedDict):
    """`lines[]`."""

    path: str
    line: int
    forward_ms: float
    backward_ms: float
    step_ms: float
    memory_bytes: int
    invocations: int
    inclusive: PhaseTimesDict
    communication_ms: float | None


class OperationNodeDict(TypedDict):
    """`operations`, and each of its `children`."""

    name: str
    kind: Literal["module", "operation"]
    module: str
    forward_ms: float
    backward_ms: float
    step_ms: float
    activation_bytes: int
    contexts: list[FrameDict]
    children: list[OperationNodeDict]


class WeightDict(TypedDict):
    """`weights[]`."""

    name: str
    size_bytes: int
    grad_size_bytes: int
    contexts: list[FrameDict]


class OptimizerStateDict(TypedDict):
    """`optimizer_state[]`."""

    name: str
    size_bytes: int
    contexts: list[FrameDict]


class UntrackedDict(TypedDict):
    """`untracked`."""

    run_time_ms: float
    memory_bytes: int
    workspace_bytes: int


class OtherTensorDict(TypedDict):
    """`peak_memory_operation.other_tensors[]` (attribute/other_tensors.py, OtherTensor)."""

    path: str
    line: int
    phase: OperationPhase
    bytes: int


class PeakMemoryOperationDict(TypedDict):
    """`peak_memory_operation`."""

    operation: str
    phase: OperationPhase
    path: str | None
    line: int | None
    other_tensors: list[OtherTensorDict]


class PeakMemoryPartsDict(TypedDict):
    """`peak_memory_parts` (attribute/breakdown.py, PeakMemoryParts)."""

    weights_bytes: int
    gradients_bytes: int
    optimizer_state_bytes: int
    activations_bytes: int
    other_bytes: int


class AttributionDict(TypedDict):
    """`attribution`."""

    recorded_iterations: int
    operations_ms: float
    user_lines_ms: float
    user_lines_fraction: float | None
    scaled_by: float
    mode: str  # "recorded" or "eager_replay"
    untracked_in_steps_fraction: float | None
    between_operations_ms: float | None
    device_time: str | None  # "kernels" or "spans" on CUDA; "thread_cpu" on a busy CPU, else None
    device_time_fallback: str | None


class TimelineEntryDict(TypedDict):
    """`timeline[]`."""

    name: str
    phase: OperationPhase
    start_ms: float
    duration_ms: float
    path: str | None
    line: int | None
    module: str
    span_ms: float | None  # on CUDA with kernel times: the CUDA-event span


class CompiledBatchSizeDict(TypedDict):
    """`compilation.batch_sizes[]`."""

    batch_size: int
    graphs: int
    seconds: float


class CompilationDict(TypedDict):
    """`compilation`."""

    graphs: int
    seconds: float
    batch_sizes: list[CompiledBatchSizeDict]
    peak_memory: str  # "compiled_program" (CUDA) or "eager_replay"


class KeptLineDict(TypedDict):
    """`memory_growth.lines[]`."""

    path: str | None
    line: int | None
    bytes: int


class MemoryGrowthDict(TypedDict):
    """`memory_growth`."""

    bytes_per_iteration: int
    lines: list[KeptLineDict]


class ReusedDict(TypedDict):
    """`reused` (analysis/known_memory.py, Reused)."""

    memory_batch_sizes: list[int]
    memory_growth_check_skipped: bool
    reason: str


class RankDict(TypedDict):
    """`distributed.ranks[]`."""

    rank: int
    run_time_ms: float
    compute_ms: float
    peak_memory_bytes: int


class BucketDict(TypedDict):
    """`distributed.buckets[]`."""

    index: int
    size_bytes: int
    parameters: list[str]
    ready_ms: float
    all_reduce_ms: float
    exposed_ms: float
    lines: list[FrameDict]


class CommunicationDict(TypedDict):
    """`distributed.communication`."""

    all_reduce_ms: float
    exposed_ms: float
    compute_ms: float
    backward_end_ms: float


class LinkDict(TypedDict):
    """`distributed.link`."""

    description: str
    source: str  # "measured" or "user"
    latency_us: float
    bandwidth_gbps: float


class ScalingRowDict(TypedDict):
    """`distributed.scaling[]`."""

    world_size: int
    samples_per_second: float
    iteration_ms: float
    exposed_ms: float
    extrapolated: bool
    measured_samples_per_second: float | None


class DistributedDict(TypedDict):
    """`distributed`."""

    world_size: int
    backend: str  # "gloo" or "nccl"
    threads_per_rank: int
    ranks: list[RankDict]
    slowest_rank: int
    buckets: list[BucketDict]
    communication: CommunicationDict
    link: LinkDict | None
    scaling: list[ScalingRowDict]


class _Timeline(TypedDict, total=False):
    timeline: list[TimelineEntryDict]  # the one field that may be missing: only when asked for


class BreakdownDict(_Timeline):
    """The breakdown's part of the top level (attribute/breakdown.py, `Breakdown.to_dict`)."""

    lines: list[LineDict]
    operations: OperationNodeDict
    weights: list[WeightDict]
    optimizer_state: list[OptimizerStateDict]
    untracked: UntrackedDict
    attribution: AttributionDict
    peak_memory_operation: PeakMemoryOperationDict | None
    peak_memory_parts: PeakMemoryPartsDict


class DocumentDict(BreakdownDict):
    """The analysis document: its top level."""

    schema: str  # SCHEMA
    engine_version: str
    torch_version: str
    project_root: str
    entry_point: str
    device: DeviceDict
    batch_size: int
    iteration: MeasurementDict
    models: ModelsDict | None
    models_withheld: str | None
    predictions: list[PredictionDict]
    batch_size_location: BatchSizeLocationDict | None
    warnings: list[str]
    distributed: DistributedDict | None
    compilation: CompilationDict | None
    memory_growth: MemoryGrowthDict | None
    runtime_changes: list[str]
    reused: ReusedDict | None


# --- the typed parts, and where they meet the shape -------------------------------------------
# Each part's own `to_dict` (in the layer that measured it, which may not import this one) writes
# a plain dict; the casts below are where it takes its declared type, and the documents written
# are checked against the declaration by tests/test_document_fields.py.


@dataclass(frozen=True)
class PredictionRow:
    """The models' prediction at one batch size, and its measurement when it was measured."""

    prediction: Prediction
    measured: Sample | None

    def to_dict(self) -> PredictionDict:
        measured = self.measured.to_dict() if self.measured else None
        return cast("PredictionDict", {**self.prediction.to_dict(), "measured": measured})


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
    # What the engine changed in the measured process's runtime (--settle-runtime; measure/runtime.py).
    runtime_changes: list[str] = field(default_factory=list)
    # Batch sizes timed beside the user's after the models were fitted (the confirming step), and
    # the batch size to use: with `models`.
    checks: list[Sample] = field(default_factory=list)
    recommendation: Recommendation | None = None
    # What was taken from the previous analysis of the same code, not measured again (the service's).
    reused: Reused | None = None

    def to_dict(self) -> DocumentDict:
        location, distributed = self.batch_size_location, self.distributed
        compilation, growth = self.compilation, self.memory_growth
        return {
            "schema": SCHEMA,
            "engine_version": skyline_engine.__version__,
            "torch_version": self.torch_version,
            "project_root": self.project_root,
            "entry_point": self.entry_point,
            "device": cast("DeviceDict", self.device.to_dict()),
            "batch_size": self.batch_size,
            "iteration": cast("MeasurementDict", self.iteration.to_dict()),
            "models": self._models(),
            "models_withheld": self.models_withheld,
            "predictions": [row.to_dict() for row in self.predictions],
            "batch_size_location": cast("BatchSizeLocationDict", location.to_dict()) if location else None,
            "warnings": list(self.warnings),
            "distributed": cast("DistributedDict", distributed.to_dict()) if distributed else None,
            "compilation": cast("CompilationDict", compilation.to_dict()) if compilation else None,
            "memory_growth": cast("MemoryGrowthDict", growth.to_dict()) if growth else None,
            "runtime_changes": list(self.runtime_changes),
            "reused": cast("ReusedDict", self.reused.to_dict()) if self.reused else None,
            **cast("BreakdownDict", self.breakdown.to_dict()),
        }

    def _models(self) -> ModelsDict | None:
        if self.models is None:
            return None
        models = {
            "samples": [s.to_dict() for s in self.samples],
            "checks": [s.to_dict() for s in self.checks],
            "recommendation": self.recommendation.to_dict() if self.recommendation else None,
            "memory_samples": [
                {"batch_size": b, "peak_memory_bytes": p.peak_bytes, "peak_memory_phase": p.peak_phase}
                for b, p in sorted(self.memory_only.items())
            ],
            **self.models.to_dict(),
        }
        return cast("ModelsDict", models)
