"""From a recorded iteration to the breakdown: per line, per module and operation, per weight.

Definitions (also in docs/analysis-document.md):
- A line's `forward_ms` is the time of the forward operations it ran itself (the innermost project
  frame at the operation was at that line), its `step_ms` that of the operations it ran itself
  inside `optimizer.step()`; its `backward_ms` is the time of the backward operations of autograd
  nodes its forward operations created.
- A line's `inclusive` times are those of every operation whose stack of project frames passes
  through it, once per operation even when recursion puts the line in a stack twice: the
  entry point's `loss = model(x, y)` holds everything the model's lines run beneath it. A backward
  operation's stack is that of the forward operation that created its node.
- A line's `memory_bytes` is the activation memory its operations left for backward, plus the
  weights and gradients of the modules it created, plus the optimizer state of an optimizer it
  constructed.
- `untracked` is what the measured iteration holds beyond the attributed parts: time between
  operations (Python, framework overhead, idle device, waiting for a CPU on a busy machine) and,
  of the memory at the peak, what is
  none of the parts alive then (`peak_memory_parts`: weights, gradients, optimizer state,
  activations).
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from skyline_engine.attribute.creation import CreationSites, Stack
from skyline_engine.attribute.frames import Context
from skyline_engine.attribute.kernels import THREAD_CPU
from skyline_engine.attribute.other_tensors import ACTIVATION, GRADIENT, OtherTensor
from skyline_engine.attribute.recorder import OperationRecord, Recording
from skyline_engine.measure.memory import tensor_bytes
from skyline_engine.measure.optimizer_state import state_bytes
from skyline_engine.vocabulary import BACKWARD, FORWARD, OPTIMIZER


def contexts_to_list(stack: Stack) -> list[dict[str, Any]]:
    return [{"path": path, "line": line} for path, line in stack]


@dataclass(frozen=True)
class PhaseTimes:
    """Milliseconds per phase of the iteration: forward, backward, and the optimizer's step."""

    forward_ms: float
    backward_ms: float
    step_ms: float

    def to_dict(self) -> dict[str, Any]:
        return {"forward_ms": self.forward_ms, "backward_ms": self.backward_ms, "step_ms": self.step_ms}

    def scaled(self, factor: float) -> PhaseTimes:
        return PhaseTimes(self.forward_ms * factor, self.backward_ms * factor, self.step_ms * factor)


@dataclass(frozen=True)
class LineCost:
    path: str
    line: int
    forward_ms: float
    backward_ms: float
    step_ms: float
    memory_bytes: int
    invocations: int
    inclusive: PhaseTimes  # of everything that ran beneath the line, itself included
    # Exposed all-reduce time of data-parallel training attributed to the line (attribute/communication.py).
    communication_ms: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "line": self.line,
            "forward_ms": self.forward_ms,
            "backward_ms": self.backward_ms,
            "step_ms": self.step_ms,
            "memory_bytes": self.memory_bytes,
            "invocations": self.invocations,
            "inclusive": self.inclusive.to_dict(),
            "communication_ms": self.communication_ms,
        }

    def scaled(self, factor: float) -> LineCost:
        """Its times multiplied by `factor`."""
        return replace(
            self,
            forward_ms=self.forward_ms * factor,
            backward_ms=self.backward_ms * factor,
            step_ms=self.step_ms * factor,
            inclusive=self.inclusive.scaled(factor),
        )


@dataclass
class OperationNode:
    """A module (its totals those of its children) or one operation at one stack of user frames."""

    name: str
    module: str
    kind: str  # "module" or "operation"
    contexts: list[Context] = field(default_factory=list)
    forward_ms: float = 0.0
    backward_ms: float = 0.0
    step_ms: float = 0.0  # the update's operations (see `lines`' `step_ms`)
    activation_bytes: float = 0
    children: OrderedDict[tuple[Any, ...], OperationNode] = field(default_factory=OrderedDict)

    def child(self, key: tuple[Any, ...], name: str, module: str, kind: str, contexts: Stack) -> OperationNode:
        """The child under `key`, made from the other arguments the first time."""
        node = self.children.get(key)
        if node is None:
            node = self.children[key] = OperationNode(name, module, kind, list(contexts))
        return node

    def add_up(self) -> None:
        """A module's totals: the sums over its children. A module never called itself (a
        ModuleList, whose blocks the code calls one by one) stands where its first child was
        called: without a line, its row in the float had no place to jump to."""
        for child in self.children.values():
            child.add_up()
        if self.kind == "module" and not self.contexts:
            self.contexts = next((list(c.contexts) for c in self.children.values() if c.contexts), [])
        if self.kind == "module":
            self.forward_ms = sum(c.forward_ms for c in self.children.values())
            self.backward_ms = sum(c.backward_ms for c in self.children.values())
            self.step_ms = sum(c.step_ms for c in self.children.values())
            self.activation_bytes = sum(c.activation_bytes for c in self.children.values())

    def scaled(self, factor: float) -> OperationNode:
        """A copy of the subtree with its times multiplied by `factor`."""
        children = OrderedDict((key, child.scaled(factor)) for key, child in self.children.items())
        return replace(
            self,
            forward_ms=self.forward_ms * factor,
            backward_ms=self.backward_ms * factor,
            step_ms=self.step_ms * factor,
            contexts=list(self.contexts),
            children=children,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "module": self.module,
            "forward_ms": self.forward_ms,
            "backward_ms": self.backward_ms,
            "step_ms": self.step_ms,
            "activation_bytes": round(self.activation_bytes),
            "contexts": contexts_to_list(tuple(self.contexts)),
            "children": [c.to_dict() for c in self.children.values()],
        }


@dataclass(frozen=True)
class WeightMemory:
    name: str
    size_bytes: int
    grad_size_bytes: int
    contexts: Stack  # where it was registered, innermost first

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "size_bytes": self.size_bytes,
            "grad_size_bytes": self.grad_size_bytes,
            "contexts": contexts_to_list(self.contexts),
        }


@dataclass(frozen=True)
class OptimizerStateMemory:
    name: str  # the optimizer's class
    size_bytes: int
    contexts: Stack  # where it was constructed

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "size_bytes": self.size_bytes, "contexts": contexts_to_list(self.contexts)}


@dataclass(frozen=True)
class Untracked:
    run_time_ms: float
    memory_bytes: int
    workspace_bytes: int = 0  # of memory_bytes, the cuBLAS workspaces (measure.memory.cublas_workspace_bytes)

    def to_dict(self) -> dict[str, Any]:
        return {
            "run_time_ms": self.run_time_ms,
            "memory_bytes": self.memory_bytes,
            "workspace_bytes": self.workspace_bytes,
        }


@dataclass(frozen=True)
class PeakMemoryParts:
    """What is alive at the memory peak, in parts that add up to it: the weights, the gradients
    alive then, the optimizer state, the activations alive then (kept for backward, not yet freed
    by it), and the other tensors (`untracked.memory_bytes`)."""

    weights_bytes: int
    gradients_bytes: int
    optimizer_state_bytes: int
    activations_bytes: int
    other_bytes: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "weights_bytes": self.weights_bytes,
            "gradients_bytes": self.gradients_bytes,
            "optimizer_state_bytes": self.optimizer_state_bytes,
            "activations_bytes": self.activations_bytes,
            "other_bytes": self.other_bytes,
        }


@dataclass(frozen=True)
class OperationSite:
    """A recorded operation and its line (for backward work, the forward line whose node it
    runs): where memory peaked, or where memory kept for good was made."""

    name: str
    phase: str
    path: str | None
    line: int | None

    def to_dict(self) -> dict[str, Any]:
        return {"operation": self.name, "phase": self.phase, "path": self.path, "line": self.line}

    @staticmethod
    def of(record: OperationRecord) -> OperationSite:
        path, line = record.context if record.context else (None, None)
        return OperationSite(record.name, record.phase, path, line)


# How the operations were obtained: recorded in the iteration that is timed, or in an eager replay
# of it (a compiled model: the recorder needs its eager code, see measure/compilation.py).
RECORDED = "recorded"
EAGER_REPLAY = "eager_replay"


@dataclass(frozen=True)
class Attribution:
    recorded_iterations: int
    operations_ms: float
    user_lines_ms: float
    user_lines_fraction: float | None
    scaled_by: float
    mode: str = RECORDED
    # Of the time between operations, the share inside optimizer steps (Recording.untracked_in_steps).
    untracked_in_steps_fraction: float | None = None
    # The recorded iterations' time between operations, per iteration, each gap at its fastest
    # (unscaled); None where not measured (CUDA, an eager replay): see `scale_to_iteration`.
    between_operations_ms: float | None = None
    # On CUDA: what an operation's time is, its kernels' ("kernels") or its CUDA-event span
    # ("spans"), and why spans where kernels were wanted; None on the CPU (wall time).
    device_time: str | None = None
    device_time_fallback: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "recorded_iterations": self.recorded_iterations,
            "operations_ms": self.operations_ms,
            "user_lines_ms": self.user_lines_ms,
            "user_lines_fraction": self.user_lines_fraction,
            "scaled_by": self.scaled_by,
            "mode": self.mode,
            "untracked_in_steps_fraction": self.untracked_in_steps_fraction,
            "between_operations_ms": self.between_operations_ms,
            "device_time": self.device_time,
            "device_time_fallback": self.device_time_fallback,
        }


@dataclass(frozen=True)
class TimelineEntry:
    name: str
    phase: str
    start_ms: float
    duration_ms: float
    path: str | None
    line: int | None
    module: str
    span_ms: float | None = None  # on CUDA with kernel times: the CUDA-event span around it

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "phase": self.phase,
            "start_ms": self.start_ms,
            "duration_ms": self.duration_ms,
            "path": self.path,
            "line": self.line,
            "module": self.module,
            "span_ms": self.span_ms,
        }


@dataclass(frozen=True)
class Breakdown:
    """The breakdown's part of the analysis document."""

    lines: list[LineCost]
    operations: OperationNode
    weights: list[WeightMemory]
    optimizer_state: list[OptimizerStateMemory]
    untracked: Untracked
    attribution: Attribution
    timeline: list[TimelineEntry] | None = None  # only when asked for
    peak_memory_operation: OperationSite | None = None  # None when the peak came before any operation
    other_tensors: list[OtherTensor] = field(default_factory=list)  # the other tensors alive there
    # What is alive at the peak (build_breakdown sets it; its other_bytes are untracked.memory_bytes).
    peak_memory_parts: PeakMemoryParts = field(default_factory=lambda: PeakMemoryParts(0, 0, 0, 0, 0))

    def to_dict(self) -> dict[str, Any]:
        peak = None
        if self.peak_memory_operation is not None:
            peak = self.peak_memory_operation.to_dict() | {"other_tensors": [t.to_dict() for t in self.other_tensors]}
        fields: dict[str, Any] = {
            "lines": [line.to_dict() for line in self.lines],
            "operations": self.operations.to_dict(),
            "weights": [w.to_dict() for w in self.weights],
            "optimizer_state": [s.to_dict() for s in self.optimizer_state],
            "untracked": self.untracked.to_dict(),
            "attribution": self.attribution.to_dict(),
            "peak_memory_operation": peak,
            "peak_memory_parts": self.peak_memory_parts.to_dict(),
        }
        if self.timeline is not None:
            fields["timeline"] = [entry.to_dict() for entry in self.timeline]
        return fields

    def with_workspaces(self, workspace_bytes: int) -> Breakdown:
        """This breakdown, its untracked memory holding `workspace_bytes` of cuBLAS workspaces (at most all of it)."""
        held = min(workspace_bytes, self.untracked.memory_bytes)
        return replace(self, untracked=replace(self.untracked, workspace_bytes=held))

    def fitted_to(self, run_time_ms: float) -> Breakdown:
        """This breakdown against the iteration as timed last: the user's batch size is timed again
        beside the others after it was broken down, and a busy machine can make the two times
        differ by tens of percent. As when it was built, the operations are scaled to the
        iteration (`scale_to_iteration`), and `untracked` is what remains of it, so that the lines
        and `untracked` add up to the document's iteration (no line's share above 100 %)."""
        attribution = self.attribution
        recorded_ms = attribution.operations_ms / attribution.scaled_by
        scale = scale_to_iteration(recorded_ms, attribution.between_operations_ms, run_time_ms) / attribution.scaled_by
        attributed_ms = attribution.user_lines_ms * scale
        return replace(
            self,
            lines=[line.scaled(scale) for line in self.lines],
            operations=self.operations.scaled(scale),
            untracked=replace(self.untracked, run_time_ms=max(0.0, run_time_ms - attributed_ms)),
            attribution=replace(
                self.attribution,
                operations_ms=attribution.operations_ms * scale,
                user_lines_ms=attributed_ms,
                user_lines_fraction=attributed_ms / run_time_ms if run_time_ms > 0 else None,
                scaled_by=self.attribution.scaled_by * scale,
            ),
        )


def _no_time() -> dict[str, float]:
    return dict.fromkeys((FORWARD, BACKWARD, OPTIMIZER), 0.0)


@dataclass
class _LineTotals:
    own_ms: dict[str, float] = field(default_factory=_no_time)  # by phase: operations it ran itself
    inclusive_ms: dict[str, float] = field(default_factory=_no_time)  # by phase: everything beneath it
    memory_bytes: float = 0
    # (recorded iteration, invocation) of each call that ran forward or optimizer operations at it
    invocations: set[tuple[Any, ...]] = field(default_factory=set)
    ran_beneath: bool = False  # a forward or optimizer operation ran beneath it (or at it)

    def cost(self, path: str, number: int, invocations: int) -> LineCost:
        own, inclusive = self.own_ms, self.inclusive_ms
        return LineCost(
            path,
            number,
            forward_ms=own[FORWARD],
            backward_ms=own[BACKWARD],
            step_ms=own[OPTIMIZER],
            memory_bytes=round(self.memory_bytes),
            invocations=invocations,
            inclusive=PhaseTimes(inclusive[FORWARD], inclusive[BACKWARD], inclusive[OPTIMIZER]),
        )


def build_breakdown(
    recording: Recording,
    model: torch.nn.Module,
    creation: CreationSites,
    run_time_ms: float,
    peak_memory_bytes: int,
    timeline: bool = False,
    mode: str = RECORDED,
    peak_memory_operation: OperationSite | None = None,
    held: Mapping[str, torch.nn.Module] | None = None,
    other_tensors: list[OtherTensor] | None = None,
    alive_at_peak: Mapping[str, int] | None = None,
) -> Breakdown:
    """The breakdown of the recorded iterations, per iteration. With `timeline`, the first recorded
    iteration's operations too; `mode` says how they were obtained (RECORDED, EAGER_REPLAY). The
    recording is not consumed: it is broken down more than once (a first result, then the final
    one). `held`: the modules the iteration keeps beside the model, by name, whose weights count
    too (an EMA copy, a teacher). `other_tensors`: the other tensors alive at `peak_memory_operation`;
    `alive_at_peak`: the bytes of activations and gradients alive there (Lifetimes.alive_at), None
    where the peak's operation is not known (then every activation and gradient counts)."""
    iterations = len(recording.iteration_starts)
    first_iteration = _timeline(recording.first_iteration()) if timeline else None
    operations = _per_iteration(recording, iterations)
    recorded_ms = sum(op.duration_ms for op in operations)
    between_ms = _between_operations(recording, iterations) if mode == RECORDED else None
    scale = scale_to_iteration(recorded_ms, between_ms, run_time_ms)
    for op in operations:
        op.duration_ms *= scale
    lines = _line_totals(operations, _iteration_of_each(recording))

    weights = _weights([("model", model), *(held or {}).items()], creation, recording.gradient_bytes)
    optimizer_state = _optimizer_state(creation)
    created = [(w.contexts, w.size_bytes + w.grad_size_bytes) for w in weights]
    created += [(s.contexts, s.size_bytes) for s in optimizer_state]
    for contexts, size in created:
        if contexts:  # the line that created it: the innermost project frame
            lines.setdefault(contexts[0], _LineTotals()).memory_bytes += size

    attributed_ms = sum(op.duration_ms for op in operations if op.context is not None)
    parts = _peak_memory_parts(peak_memory_bytes, weights, optimizer_state, operations, alive_at_peak)
    module_calls = Counter(call.context for call in recording.module_calls)
    return Breakdown(
        lines=[
            totals.cost(path, number, _invocations(totals, module_calls[(path, number)], iterations))
            for (path, number), totals in sorted(lines.items())
        ],
        operations=_operation_tree(operations, recording),
        weights=weights,
        optimizer_state=optimizer_state,
        untracked=Untracked(max(0.0, run_time_ms - attributed_ms), parts.other_bytes),
        attribution=Attribution(
            recorded_iterations=iterations,
            operations_ms=sum(op.duration_ms for op in operations),
            user_lines_ms=attributed_ms,
            user_lines_fraction=attributed_ms / run_time_ms if run_time_ms > 0 else None,
            scaled_by=scale,
            mode=mode,
            untracked_in_steps_fraction=recording.untracked_in_steps(),
            between_operations_ms=between_ms,
            device_time=recording.device_time,
            device_time_fallback=recording.device_time_fallback,
        ),
        timeline=first_iteration,
        peak_memory_operation=peak_memory_operation,
        other_tensors=list(other_tensors or []),
        peak_memory_parts=parts,
    )


def _peak_memory_parts(
    peak_memory_bytes: int,
    weights: list[WeightMemory],
    optimizer_state: list[OptimizerStateMemory],
    operations: list[OperationRecord],
    alive_at_peak: Mapping[str, int] | None,
) -> PeakMemoryParts:
    """The peak's parts: weights and optimizer state (alive throughout a steady-state iteration),
    the gradients and activations alive at the peak, and the rest, the other tensors. Where the
    peak's operation is not known, every gradient and every activation (which are not all alive at
    once), and the rest at least 0."""
    if alive_at_peak is None:
        gradients = sum(w.grad_size_bytes for w in weights)
        activations = round(sum(op.activation_bytes for op in operations))
    else:
        gradients, activations = alive_at_peak[GRADIENT], alive_at_peak[ACTIVATION]
    weights_bytes = sum(w.size_bytes for w in weights)
    state = sum(s.size_bytes for s in optimizer_state)
    other = max(0, peak_memory_bytes - weights_bytes - gradients - state - activations)
    return PeakMemoryParts(weights_bytes, gradients, state, activations, other)


def _line_totals(operations: list[OperationRecord], iteration_of: list[int]) -> dict[Context, _LineTotals]:
    """Each line's own and inclusive times, activations and invocations; every line of every
    operation's stack is one, so that lines that only call into the project appear too."""
    lines: dict[Context, _LineTotals] = {}
    for op, iteration in zip(operations, iteration_of):
        if op.context is None:
            continue
        own = lines.setdefault(op.context, _LineTotals())
        own.own_ms[op.phase] += op.duration_ms
        if op.phase != BACKWARD:
            own.invocations.add((iteration, op.invocation))
            own.memory_bytes += op.activation_bytes
        for context in set(op.stack):  # a set: once per line, however often recursion repeats it
            line = lines.setdefault(context, _LineTotals())
            line.inclusive_ms[op.phase] += op.duration_ms
            line.ran_beneath = line.ran_beneath or op.phase != BACKWARD
    return lines


def _invocations(totals: _LineTotals, module_calls: int, iterations: int) -> int:
    """Calls per iteration of a line that ran forward or optimizer operations itself; for a line
    that only calls into the project, the module calls it made per iteration, at least 1 (a call of
    a plain function is not seen); 0 for a line beneath which no forward operation ran."""
    per_iteration = max(iterations, 1)
    if totals.invocations:
        return max(1, round(len(totals.invocations) / per_iteration))
    if totals.ran_beneath:
        return max(1, round(module_calls / per_iteration))
    return 0


def _iteration_of_each(recording: Recording) -> list[int]:
    """The recorded iteration each of `recording.operations` belongs to (0 for the first)."""
    starts = recording.iteration_starts or [0]
    ends = [*starts[1:], len(recording.operations)]
    which = [0] * starts[0]
    for iteration, (start, end) in enumerate(zip(starts, ends)):
        which += [iteration] * (end - start)
    return which


def _timeline(operations: list[OperationRecord]) -> list[TimelineEntry]:
    origin = operations[0].start_ms if operations else 0.0
    return [
        TimelineEntry(
            name=op.name,
            phase=op.phase,
            start_ms=op.start_ms - origin,
            duration_ms=op.duration_ms,
            path=op.context[0] if op.context else None,
            line=op.context[1] if op.context else None,
            module=op.module,
            span_ms=op.span_ms,
        )
        for op in operations
    ]


def scale_to_iteration(operations_ms: float, between_ms: float | None, run_time_ms: float) -> float:
    """The factor the operations' times (`operations_ms` an iteration, each at its fastest) are
    scaled by to fit the measured iteration (`attribution.scaled_by`), so that lines and
    `untracked` add up to it.

    Operations can run slower while recorded than in the measured iteration (the recorder's own
    work between them evicts caches): where they exceed it, they are scaled down to it. On a busy
    machine the measured iteration is longer than its operations and the Python between them
    unimpeded (`between_ms`, each gap at its fastest in the recorded iterations; None where not
    measured): the operations and that Python waited for a CPU. That wait is shared out over them
    in proportion to their times (a wait lands on what runs then), so that each line's share is
    its share of the unimpeded iteration. Under two busy processes the transformer example's
    iteration measured 83, 214 and 587 ms in three back-to-back analyses, its operations 26 to 30
    ms: with the wait left to `untracked`, its top line's share was 12, 5 and 2 %. The Python
    between operations counts at most what the measured iteration leaves beside them (the
    recorder's own work makes the recorded gaps longer than the unrecorded ones), so that on a
    quiet machine nothing is scaled up."""
    if operations_ms <= 0 or run_time_ms <= 0:
        return 1.0
    if between_ms is None:
        return run_time_ms / operations_ms if operations_ms > run_time_ms else 1.0
    unimpeded_ms = operations_ms + min(between_ms, max(0.0, run_time_ms - operations_ms))
    return run_time_ms / unimpeded_ms


def _per_iteration(recording: Recording, iterations: int) -> list[OperationRecord]:
    """Copies of the records of `iterations` recorded iterations, scaled to one iteration: each
    operation's time is its typical time (`_typical`), shared out over its iterations. On a busy
    CPU, its time is the CPU time of the thread that ran it (`OperationRecord.cpu_ms`): its
    fastest wall time still waited for a core where an operation is long. Under two busy
    processes the small GPT's short operations reached their quiet wall time at their fastest of
    15 iterations (its MLP line 42-44 ms against 44.5 quiet) and its long ones did not (the head's
    product and the loss, 123-141 and 65-75 ms against 44 and 27): its head line read 40-43 % of
    the iteration, 24 % quiet. The thread's CPU time leaves out the time it waited for a core, and
    the time it slept at a parallel region's end while another thread of the region waited: under
    the same load the head's products read 19.0-19.5, 13.4-13.6 and 12.2-12.4 ms of CPU time, 18.7,
    13.4 and 12.1 ms of wall time quiet (where the two agree on every operation)."""
    operations = recording.operations
    durations = _typical(recording, "cpu_ms" if recording.device_time == THREAD_CPU else "duration_ms")
    copies = {
        # Bytes too are divided exactly: one tensor saved in each of 3 iterations, divided per
        # record with //, lost a byte of its 65,536 (the sums are rounded where they are written).
        id(op): replace(op, duration_ms=duration / iterations, activation_bytes=op.activation_bytes / iterations)
        for op, duration in zip(operations, durations)
    }
    for op in copies.values():
        if op.creator is not None:
            op.creator = copies.get(id(op.creator), op.creator)
    return list(copies.values())


def _between_operations(recording: Recording, iterations: int) -> float | None:
    """The time between operations of one recorded iteration, each gap at its typical time
    (`_typical`); None where gaps are not measured (the GPU's device time)."""
    if recording.wall_ns == 0:
        return None
    return sum(_typical(recording, "gap_before_ms")) / iterations


def _typical(recording: Recording, measured: str) -> list[float]:
    """Each recorded operation's time (`measured`: `duration_ms`, or `gap_before_ms`, the Python
    before it), to be averaged over the recorded iterations. Iterations that ran the same
    operations at the same lines give each operation the fastest of its times in them: what it
    takes unimpeded. The first recorded iteration runs the recorder's own code for the first
    time and is slower (the default example's operations took 1.2 to 1.4 times as long in it as in
    the next two), and on a busy machine any operation can wait for a CPU in any iteration: the
    median of three kept such waits: under two busy processes, the transformer example's MLP line
    took 40, 20 and 10 % of the operations' time in three back-to-back analyses, and 38, 39, 40 and
    33 % in four with the fastest. The time waited is the iteration's and stays in `untracked`.
    Iterations that differ keep their own times. Where `measured` is None (`cpu_ms` of a
    collective), the operation's wall time."""

    def time_of(op: OperationRecord) -> float:
        value = getattr(op, measured)
        return op.duration_ms if value is None else value

    runs = recording.iterations()
    if not runs or recording.iteration_starts[0] != 0 or len({tuple(map(_identity, run)) for run in runs}) != 1:
        return [time_of(op) for op in recording.operations]
    fastest = [min(time_of(op) for op in same) for same in zip(*runs)]
    return fastest * len(runs)


def _identity(op: OperationRecord) -> tuple[Any, ...]:
    return (op.name, op.phase, op.stack)


def _operation_tree(operations: list[OperationRecord], recording: Recording) -> OperationNode:
    """Modules in execution order, each with its operations (one node per operation name and
    line) and its submodules; operations outside any module hang from the root."""
    root = OperationNode("iteration", "", "module")
    call_sites: dict[str, list[Context]] = {}
    for call in recording.module_calls:
        sites = call_sites.setdefault(call.path, [])
        if call.context is not None and call.context not in sites:
            sites.append(call.context)
    leaves: dict[int, OperationNode] = {}
    for op in operations:
        if op.phase != BACKWARD:
            leaf = _leaf(root, op, call_sites)
            if op.phase == OPTIMIZER:
                leaf.step_ms += op.duration_ms
            else:
                leaf.forward_ms += op.duration_ms
            leaf.activation_bytes += op.activation_bytes
            leaves[id(op)] = leaf
    for op in operations:
        if op.phase != BACKWARD:
            continue
        creators_leaf = leaves.get(id(op.creator)) if op.creator is not None else None
        if creators_leaf is None:  # work of no forward operation's node: a leaf named after the node
            name = op.node_name or op.name
            creators_leaf = root.child(("backward", name, op.stack), name, "", "operation", op.stack)
        creators_leaf.backward_ms += op.duration_ms
    root.add_up()
    return root


def _leaf(root: OperationNode, op: OperationRecord, call_sites: dict[str, list[Context]]) -> OperationNode:
    node = root
    if op.module:
        parts = op.module.split(".")
        for depth in range(1, len(parts) + 1):
            path = ".".join(parts[:depth])
            node = node.child(("module", path), parts[depth - 1], path, "module", tuple(call_sites.get(path, ())))
    return node.child(("operation", op.name, op.stack), op.name, op.module, "operation", op.stack)


def _weights(
    modules: Sequence[tuple[str, torch.nn.Module]], creation: CreationSites, gradients: Mapping[int, int]
) -> list[WeightMemory]:
    """Each parameter of the named `modules` once (one shared with the model, as torch.compile's
    wrapper's are, under the model's name), named with its module's name as prefix; the first is
    the model, the others the modules the iteration holds. A gradient's bytes are the most it held
    while alive: `gradients` (by the parameter's id, Recording.gradient_bytes), or its `.grad` now
    (an iteration that ends with `zero_grad(set_to_none=True)` has none left)."""
    entries = []
    seen = set()
    for index, (prefix, module) in enumerate(modules):
        for name, param in module.named_parameters(prefix=prefix):
            if id(param) in seen:
                continue
            seen.add(id(param))
            grad = param.grad
            contexts = creation.tensor_stack(param)
            if not contexts and index > 0:  # a held copy no registration named: where the code made it
                contexts = creation.held_stack(prefix)
            entries.append(
                WeightMemory(
                    name=name,
                    size_bytes=tensor_bytes(param),
                    grad_size_bytes=max(tensor_bytes(grad) if grad is not None else 0, gradients.get(id(param), 0)),
                    contexts=contexts,
                )
            )
    return entries


def _optimizer_state(creation: CreationSites) -> list[OptimizerStateMemory]:
    entries = []
    for optimizer in creation.optimizer_objects():
        name, size = type(optimizer).__name__, state_bytes(optimizer)
        entries.append(OptimizerStateMemory(name, size, creation.optimizer_stack(optimizer)))
    return entries
