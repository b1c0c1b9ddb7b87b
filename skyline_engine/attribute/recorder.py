"""Recording one training iteration operation by operation, with the user's line for each.

`OperationRecorder` is a TorchDispatchMode active around a whole iteration. Every aten operation
passes through it, forward, backward and optimizer alike. For each it records:

- its duration, timed around the operation itself (wall time on CPU, CUDA events on the GPU), so
  the recorder's own Python work between operations is not counted;
- on the CPU, the time before it since the previous operation (or the iteration's start): the
  user's Python between operations, the recorder's own work (after each operation, and in its
  module, step, gradient and saved-tensor hooks) left out;
- its call site: the innermost frame inside the project (torch.profiler's stacks name functions,
  not lines; the interpreter's frames give the line);
- the module running it (global module hooks keep a stack);
- for backward operations, the autograd node being run (`torch._C._current_autograd_node()`) and
  its sequence number. A forward operation sees the autograd sequence counter just after its node
  was created, so counter − 1 is the node's number, and backward work is attributed to the
  forward operation that created the node. Backward never reads the current thread's frames for
  that: on CUDA it runs on autograd's device thread (the dispatch mode goes along, the Python
  stack does not). Work of a node no recorded forward operation created (gradient accumulation)
  belongs to the line that called backward, read from the stack of the thread that did;
- for forward operations, the storage of their outputs, and, through saved-tensor hooks, which of
  those storages autograd keeps for backward: the operation's activation memory;
- whether it ran inside `optimizer.step()` (torch's global optimizer step pre- and post-hooks)
  without gradients: the phase `optimizer`, the optimizer's work, told apart from the forward
  pass's (a closure the step calls, as LBFGS's, runs the model with gradients: forward work).
  The rest of the update is that phase too: work on the gradients, or writing the parameters in
  place, outside a step (clipping, zeroing in place, an update by hand; attribute/updates.py).
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import sys
import threading
import weakref
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from time import perf_counter_ns, thread_time_ns  # bound now: user code may replace time's (freezegun)
from typing import Any, Callable, NamedTuple, Protocol, TypeVar

import torch
from torch._ops import OpOverload
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
from torch.profiler import record_function
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.hooks import RemovableHandle
from torch.utils.weak import WeakIdKeyDictionary

from skyline_engine.attribute.frames import CallSites, Context
from skyline_engine.attribute.kernels import KERNELS, SPANS, range_name
from skyline_engine.attribute.other_tensors import ACTIVATION, GRADIENT, Lifetimes
from skyline_engine.attribute.updates import UpdateWork
from skyline_engine.measure import saved_tensors
from skyline_engine.measure.iteration import after_accumulation
from skyline_engine.measure.memory import MemoryMeter, gradient_storages, is_work, tensor_bytes, tensor_storages
from skyline_engine.vocabulary import BACKWARD, FORWARD, OPTIMIZER

# A GradScaler's work around the step (unscaling the gradients, checking them for inf and NaN,
# updating its scale) is the optimizer's phase: `scaler.step(optimizer)` is the step.
_SCALER_CODES = frozenset(
    getattr(torch.amp.GradScaler, name).__code__ for name in ("step", "unscale_", "_unscale_grads_", "update")
)

# Sequence number of nodes that have none (AccumulateGrad): their work is attributed by call site.
_NO_SEQUENCE = (1 << 64) - 1

# Collectives called by the user's code (torch.distributed's and its functional ones'): they wait
# for other processes, and their wall time is their cost.
_WAITING_NAMESPACES = frozenset({"c10d", "_c10d_functional"})


@dataclass
class OperationRecord:
    name: str
    phase: str  # FORWARD, BACKWARD or OPTIMIZER
    stack: tuple[Context, ...]  # the project frames at the operation, innermost first
    module: str
    # Forward and optimizer work: one execution of the call site, the invocation of the innermost
    # user module running and the frame (frames of calls made one after the other may share an id,
    # so calls of a helper function within one module invocation count once).
    invocation: tuple[int, int | None] | tuple[()] = ()
    duration_ms: float = 0.0
    # Bytes it left saved for backward; per iteration (a fraction) once averaged over the recorded ones.
    activation_bytes: float = 0
    node_name: str | None = None
    creator: OperationRecord | None = None  # for backward: the forward operation of its node
    start_ms: float = 0.0  # from the start of the recording
    # On the CPU: the wall time since the previous operation ended (or the iteration started), the
    # recorder's own work left out; 0 on the GPU (device time and host time do not compare).
    gap_before_ms: float = 0.0
    # On CUDA with kernel times (attribute/kernels.py): the CUDA-event span around it, while
    # `duration_ms` is its kernels' device time; None elsewhere.
    span_ms: float | None = None
    # On the CPU: the CPU time of the thread that ran it, over its `duration_ms` (its share of a
    # parallel region's work and its wait at the region's end, not the time it waited for a
    # core: attribute/breakdown.py takes it on a busy machine); None elsewhere.
    cpu_ms: float | None = None

    @property
    def context(self) -> Context | None:
        return self.stack[0] if self.stack else None


@dataclass
class ModuleCall:
    path: str
    context: Context | None


class _Timer(Protocol):
    """Marks the moments around each operation (`start`, then `end`); `assign` gives a record its
    start and duration, at once or (CUDA) when `resolve` reads the device's clock."""

    def start(self) -> Any: ...
    def end(self) -> Any: ...
    def assign(self, record: OperationRecord, start: Any, end: Any) -> None: ...
    def resolve(self) -> None: ...


class _CpuMark(NamedTuple):
    wall_ns: int
    thread_ns: int
    reading_ns: int = 0  # what reading the thread's clock took before `wall_ns`: the recorder's own work


class _CpuTimer:
    """Wall time around each operation, and the CPU time of the thread running it. Reading the
    thread's CPU clock is a system call (0.6 us here, against 0.05 us for the wall clock): it is
    read outside the wall clock's marks, so that the wall time holds none of it."""

    def __init__(self) -> None:
        self.origin = perf_counter_ns()

    @staticmethod
    def start() -> _CpuMark:
        before_ns = perf_counter_ns()
        thread_ns = thread_time_ns()
        wall_ns = perf_counter_ns()
        return _CpuMark(wall_ns, thread_ns, wall_ns - before_ns)

    @staticmethod
    def end() -> _CpuMark:
        wall_ns = perf_counter_ns()
        return _CpuMark(wall_ns, thread_time_ns())

    def assign(self, record: OperationRecord, start: _CpuMark, end: _CpuMark) -> None:
        record.start_ms = (start.wall_ns - self.origin) / 1e6
        record.duration_ms = (end.wall_ns - start.wall_ns) / 1e6
        record.cpu_ms = min(record.duration_ms, (end.thread_ns - start.thread_ns) / 1e6)

    def resolve(self) -> None:
        pass


class _CudaTimer:
    """Device time: CUDA events around each operation, read once after the iteration so that
    recording never synchronises."""

    def __init__(self) -> None:
        self.origin = self.start()
        self.pending: list[tuple[OperationRecord, torch.cuda.Event, torch.cuda.Event]] = []

    @staticmethod
    def start() -> torch.cuda.Event:
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    end = start

    def assign(self, record: OperationRecord, start: torch.cuda.Event, end: torch.cuda.Event) -> None:
        self.pending.append((record, start, end))

    def resolve(self) -> None:
        if not self.pending:
            return
        torch.cuda.synchronize()
        for record, start, end in self.pending:
            record.start_ms = float(self.origin.elapsed_time(start))
            record.duration_ms = float(start.elapsed_time(end))
        self.pending.clear()


@dataclass(frozen=True)
class ModelCallInput:
    """A call of the model: the first two sizes of its first tensor argument, and that tensor
    (weakly; both empty where it had none)."""

    sizes: tuple[int, ...]
    first: weakref.ref[torch.Tensor] | None

    @classmethod
    def of(cls, args: Any) -> ModelCallInput:
        first = next((value for value in tree_flatten(args)[0] if isinstance(value, torch.Tensor)), None)
        return cls((), None) if first is None else cls(tuple(first.shape[:2]), weakref.ref(first))


@dataclass
class Recording:
    operations: list[OperationRecord] = field(default_factory=list)
    module_calls: list[ModuleCall] = field(default_factory=list)
    iteration_starts: list[int] = field(default_factory=list)  # index of each iteration's first operation
    # In the first recorded iteration: the calls of the model itself (the provider's) outside any
    # optimizer step, the gradients accumulated into each of its parameters (by id), and the steps
    # of each optimizer (by id): together they tell gradient accumulation.
    model_call_inputs: list[ModelCallInput] = field(default_factory=list)
    gradient_accumulations: Counter[int] = field(default_factory=Counter)
    # In every recorded iteration: the most bytes each parameter's gradient held once backward
    # accumulated into it (by the parameter's id), the model's and the held modules'. An iteration
    # that frees its gradients at its end (`zero_grad(set_to_none=True)` after the step) leaves
    # no `.grad` to read them from afterwards.
    gradient_bytes: dict[int, int] = field(default_factory=dict)
    optimizer_steps: Counter[int] = field(default_factory=Counter)
    # On the CPU, in every recorded iteration: the wall time recorded, the part of it inside
    # optimizer steps (a closure they call included), and the operations' time inside them; what
    # passes between operations inside steps is the optimizer's own Python (LBFGS's line search).
    # The recorder's own work after each operation is neither: it is left out of both.
    wall_ns: int = 0
    steps_wall_ns: int = 0
    steps_operations_ns: int = 0
    recorder_ns: int = 0
    steps_recorder_ns: int = 0
    # What the operations' times are (attribute/kernels.py): on CUDA, KERNELS or SPANS, and why
    # spans where kernel time could not be had; on the CPU, None (wall time), or THREAD_CPU where
    # other processes kept its cores busy (each operation's `cpu_ms`).
    device_time: str | None = None
    device_time_fallback: str | None = None

    def take_kernel_times(
        self, ranges: Mapping[int, OperationRecord], kernel_ms: Mapping[int, float] | None, fallback: str | None
    ) -> None:
        """The kernel time of the operations recorded in `ranges` (by their ranges' serials), a
        capture's `kernel_ms`; where it has none, or misses an operation, every operation keeps its
        span (one figure for all: never kernels for some and spans for others), and why."""
        missing = [serial for serial in ranges if kernel_ms is not None and serial not in kernel_ms]
        if kernel_ms is None or missing:
            why = fallback or f"torch.profiler's trace lacks {len(missing)} of {len(ranges)} recorded operations"
            for op in self.operations:
                if op.span_ms is not None:
                    op.duration_ms, op.span_ms = op.span_ms, None
            self.device_time, self.device_time_fallback = SPANS, why
            return
        for serial, record in ranges.items():
            record.span_ms, record.duration_ms = record.duration_ms, kernel_ms[serial]
        self.device_time = KERNELS

    def untracked_in_steps(self) -> float | None:
        """The share of the time between operations that passed inside optimizer steps; None
        where it was not measured (CUDA) or no time passed between operations."""
        operations_ns = sum(round(op.duration_ms * 1e6) for op in self.operations)
        between = self.wall_ns - operations_ns - self.recorder_ns
        if self.wall_ns == 0 or between <= 0:
            return None
        in_steps = self.steps_wall_ns - self.steps_operations_ns - self.steps_recorder_ns
        return min(1.0, max(0.0, in_steps / between))

    @property
    def model_calls(self) -> int:
        return len(self.model_call_inputs)

    def iterations(self) -> list[list[OperationRecord]]:
        """The operations of each recorded iteration, in order."""
        ends = [*self.iteration_starts[1:], len(self.operations)]
        return [self.operations[start:end] for start, end in zip(self.iteration_starts, ends)]

    def first_iteration(self) -> list[OperationRecord]:
        end = self.iteration_starts[1] if len(self.iteration_starts) > 1 else len(self.operations)
        return self.operations[:end]

    def micro_batches(self, batch_size: int) -> int:
        """Gradient accumulation: k > 1 when the first iteration calls the model k times (outside a
        step), accumulates k gradients into its parameters (k backward passes that reach them) and
        steps each optimizer once (k micro-batches per optimizer step), unless those calls split
        one batch of `batch_size` samples (`x.chunk(4)`) or all take the same one (sharpness-aware
        minimization's two passes); else 1 (a model also called for evaluation, say, or for an
        adversarial example, whose gradient reaches the input alone, or several steps per
        iteration)."""
        steps_once = bool(self.optimizer_steps) and set(self.optimizer_steps.values()) == {1}
        k = self.model_calls
        accumulated = max(self.gradient_accumulations.values(), default=0)
        accumulates = k > 1 and accumulated == k and steps_once
        sizes = [call.sizes for call in self.model_call_inputs]
        firsts = [call.first for call in self.model_call_inputs]
        one_batch = _split_batch(sizes, batch_size) or _same_batch(firsts)
        return k if accumulates and not one_batch else 1


def _split_batch(call_sizes: list[tuple[int, ...]], batch_size: int) -> bool:
    """Whether the model's calls split one batch of `batch_size` samples between them: their first
    tensor arguments' sizes along the batch's dimension (the first, else the second: sequence
    first) add up to it, where they are not each `batch_size` (micro-batches of that size: an
    input provider that makes k of them). Undecided (inputs by keyword, no tensor): no split."""
    for dim in (0, 1):
        sizes = [size[dim] for size in call_sizes if len(size) > dim]
        if len(sizes) < len(call_sizes) or not sizes:
            return False
        if all(size == batch_size for size in sizes):
            return False
        if sum(sizes) == batch_size:
            return True
    return False


def _same_batch(firsts: list[weakref.ref[torch.Tensor] | None]) -> bool:
    """Whether every call of the model took the same tensor first: one batch evaluated again (SAM
    runs forward and backward twice on it), not micro-batches. The same object, alive: a
    micro-batch made in the loop may reuse a freed one's memory, never the living object."""
    first = firsts[0]() if firsts and firsts[0] is not None else None
    return first is not None and all(ref is not None and ref() is first for ref in firsts)


_Hook = TypeVar("_Hook", bound=Callable[..., Any])


def _own_work(hook: _Hook) -> _Hook:
    """A hook of the recorder's, its time kept apart from the user's between operations."""

    @functools.wraps(hook)
    def timed(self: OperationRecorder, *args: Any) -> Any:
        began = perf_counter_ns()
        try:
            return hook(self, *args)
        finally:
            self._hooks_ns += perf_counter_ns() - began

    return timed  # type: ignore[return-value]


class OperationRecorder(TorchDispatchMode):
    def __init__(
        self,
        call_sites: CallSites,
        module_names: dict[int, str],
        device: torch.device,
        model: torch.nn.Module | None = None,
        held: Sequence[torch.nn.Module] = (),
    ) -> None:
        """`model`: the provider's model, whose calls are counted (Recording.model_calls); `held`:
        the other modules the iteration holds, whose parameters it may update too (an EMA copy).
        The timer, hooks and step count are set each time the recorder is entered."""
        super().__init__()  # type: ignore[no-untyped-call]  # torch leaves TorchDispatchMode unannotated
        self.call_sites = call_sites
        self.module_names = module_names
        self.device = device
        self._model_id = id(model) if model is not None else None
        self._model_parameters = [p for p in model.parameters() if p.requires_grad] if model is not None else []
        self._model_parameter_ids = {id(p) for p in self._model_parameters}
        # Every parameter that can get a gradient, the held modules' too (a GAN's discriminator).
        held_parameters = [p for module in held for p in module.parameters() if p.requires_grad]
        self._parameters = list({id(p): p for p in [*self._model_parameters, *held_parameters]}.values())
        self._updates = UpdateWork.of(model, held)
        # Shown every operation's outputs, outside the timed span: the memory profile of the
        # recorded iteration without a second dispatch mode (which cost the transformer example
        # 9 ms a recorded iteration of 43 ms). Set for the first recorded iteration only.
        self.memory: MemoryMeter | None = None
        # With the meter: the storages its operations make, to name what is alive at its peak.
        self.lifetimes: Lifetimes | None = None
        self.timer: _Timer
        self.recording = Recording()
        self._forward_by_sequence: dict[int, OperationRecord] = {}
        self._producer = WeakIdKeyDictionary()  # storage -> forward OperationRecord that created it
        self._saved = WeakIdKeyDictionary()  # storages already counted as activations
        self._call_stack: list[tuple[str, int]] = []  # (module path, invocation id) of the modules running
        self._steps_running: int  # optimizer.step() calls under way (an optimizer may step another)
        self._entered_ns = 0  # when the recorder was last entered
        self._step_entered_ns = 0  # when the outermost step under way began
        # Since when the user's code has run (the previous operation's end, the recorder's work after
        # it done, or the iteration's start), and the recorder's hooks' time since: the gap's parts.
        self._resumed_ns = 0
        self._hooks_ns = 0
        self._module_call_count = 0
        self._users_module_types: dict[type, bool] = {}
        self._hooks: list[RemovableHandle]
        self._saved_tensor_hooks: contextlib.AbstractContextManager[Any]
        self._iteration_thread: int  # the thread that runs the iteration
        # On CUDA while kernels are captured (attribute/kernels.py): each operation inside a
        # profiler range named by its serial, and the records by serial; None when not.
        self.kernel_ranges: dict[int, OperationRecord] | None = None
        self._serials = itertools.count()  # next() is atomic: backward may run on another thread

    # -- lifetime -------------------------------------------------------------------------------

    def __enter__(self) -> OperationRecorder:
        self._iteration_thread = threading.get_ident()
        self.timer = _CudaTimer() if self.device.type == "cuda" else _CpuTimer()
        self._steps_running = 0
        self._entered_ns = perf_counter_ns()
        if self.lifetimes is not None:  # the gradients alive as it starts: the previous iteration's
            for parameter in self._parameters:
                if parameter.grad is not None:
                    for storage in gradient_storages(parameter.grad):
                        self.lifetimes.gradient_alive(storage)
        self._hooks = [
            torch.nn.modules.module.register_module_forward_pre_hook(self._enter_module),
            torch.nn.modules.module.register_module_forward_hook(self._leave_module),
            register_optimizer_step_pre_hook(self._enter_step),
            register_optimizer_step_post_hook(self._leave_step),
            *(after_accumulation(parameter, self._accumulated) for parameter in self._parameters),
        ]
        self._saved_tensor_hooks = saved_tensors.hooks(self._pack)
        self._saved_tensor_hooks.__enter__()
        super().__enter__()  # type: ignore[no-untyped-call]  # torch leaves TorchDispatchMode unannotated
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            super().__exit__(*exc)  # type: ignore[no-untyped-call]  # torch leaves TorchDispatchMode unannotated
        finally:
            self._saved_tensor_hooks.__exit__(*exc)
            for hook in self._hooks:
                hook.remove()
            self.timer.resolve()
            if isinstance(self.timer, _CpuTimer):  # device time and host wall time do not compare
                self.recording.wall_ns += perf_counter_ns() - self._entered_ns

    def start_iteration(self) -> None:
        self.recording.iteration_starts.append(len(self.recording.operations))
        self._updates.new_iteration()
        self._resumed_ns, self._hooks_ns = perf_counter_ns(), 0

    # -- modules ----------------------------------------------------------------------------------

    @_own_work
    def _enter_module(self, module: torch.nn.Module, args: Any) -> None:
        path = self.module_names.get(id(module), type(module).__name__)
        context, _ = self.call_sites.innermost(skip=1)
        # A call of a module whose forward is the user's starts a new invocation of the lines it
        # runs; a torch module (Linear, Sequential) runs within its caller's invocation.
        call_id = self._call_stack[-1][1] if self._call_stack else 0
        if self._is_users(module):
            self._module_call_count += 1
            call_id = self._module_call_count
        self._call_stack.append((path, call_id))
        self.recording.module_calls.append(ModuleCall(path, context))
        # A call inside a step is the step's closure (LBFGS evaluates the same batch several
        # times): no micro-batch of its own.
        if id(module) == self._model_id and len(self.recording.iteration_starts) == 1 and not self._steps_running:
            self.recording.model_call_inputs.append(ModelCallInput.of(args))

    @_own_work
    def _leave_module(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        if self._call_stack:
            self._call_stack.pop()

    @_own_work
    def _accumulated(self, parameter: torch.Tensor) -> None:
        gradient = parameter.grad
        if gradient is not None:
            sizes = self.recording.gradient_bytes
            sizes[id(parameter)] = max(sizes.get(id(parameter), 0), tensor_bytes(gradient))
            if self.lifetimes is not None:  # counted with the weights
                for storage in gradient_storages(gradient):
                    self.lifetimes.accounted(storage, GRADIENT)
        if id(parameter) in self._model_parameter_ids and len(self.recording.iteration_starts) == 1:
            self.recording.gradient_accumulations[id(parameter)] += 1

    @_own_work
    def _enter_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if self._steps_running == 0:
            self._step_entered_ns = perf_counter_ns()
        self._steps_running += 1
        if len(self.recording.iteration_starts) == 1:
            self.recording.optimizer_steps[id(optimizer)] += 1

    @_own_work
    def _leave_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        # A step that raised never calls its post-hook; the next iteration's recorder starts at 0.
        self._steps_running = max(0, self._steps_running - 1)
        if self._steps_running == 0 and isinstance(self.timer, _CpuTimer):
            self.recording.steps_wall_ns += perf_counter_ns() - self._step_entered_ns

    def _is_users(self, module: torch.nn.Module) -> bool:
        kind = type(module)
        known = self._users_module_types.get(kind)
        if known is None:
            code = getattr(getattr(kind, "forward", None), "__code__", None)
            known = code is not None and self.call_sites.files.contains(code.co_filename)
            self._users_module_types[kind] = known
        return known

    # -- operations -------------------------------------------------------------------------------

    def __torch_dispatch__(
        self, func: OpOverload, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        kwargs = kwargs or {}
        if not is_work(func):
            return func(*args, **kwargs)
        node = torch._C._current_autograd_node()
        next_sequence = torch._C._autograd._get_sequence_nr()
        ranges = self.kernel_ranges
        if ranges is None:
            start = self.timer.start()
            out = func(*args, **kwargs)
            end = self.timer.end()  # before any of the recorder's own work
        else:
            serial = next(self._serials)
            # The range holds the span's events, so that its own host work stays out of the span.
            with record_function(range_name(serial)):
                start = self.timer.start()
                out = func(*args, **kwargs)
                end = self.timer.end()
        record = self._record(func, node, next_sequence, args, kwargs)
        self.timer.assign(record, start, end)
        if func.namespace in _WAITING_NAMESPACES:
            record.cpu_ms = None  # its time is a wait for other processes, which CPU time leaves out
        if ranges is not None:
            ranges[serial] = record
        if self.memory is not None:
            self.memory.after_operation(func.__name__, out)
        # Not the optimizer's outputs: its in-place updates return the parameters, which the next
        # recorded iteration saves for backward, and parameters are no activations.
        if record.phase == FORWARD or self.lifetimes is not None:
            self._note_made(out, args, kwargs, record)
        if record.phase == OPTIMIZER:
            self._updates.note_outputs(out)
        if isinstance(start, _CpuMark):  # the CPU's clock (Recording.wall_ns)
            self._note_times(record, start, end)
        return out

    def _note_times(self, record: OperationRecord, start: _CpuMark, end: _CpuMark) -> None:
        """The operation's time, the Python before it, and the recorder's own work around it (its
        clocks read before, all of it after), inside a step or not: the rest of the wall time is
        the Python between operations. (The recorder's own work counted as that Python made a
        step of 40 long products read as mostly Python.)"""
        before = start.wall_ns - start.reading_ns
        record.gap_before_ms = max(0, before - self._resumed_ns - self._hooks_ns) / 1e6
        resumed = perf_counter_ns()
        own = resumed - end.wall_ns + start.reading_ns
        self._resumed_ns, self._hooks_ns = resumed, 0
        self.recording.recorder_ns += own
        if self._steps_running:
            self.recording.steps_operations_ns += end.wall_ns - start.wall_ns
            self.recording.steps_recorder_ns += own

    def _record(
        self, func: OpOverload, node: Any, next_sequence: int, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> OperationRecord:
        op_name = func.overloadpacket.__name__
        if node is None:
            stack, frame_id = self.call_sites.stack(skip=2)
            module, call_id = self._call_stack[-1] if self._call_stack else ("", 0)
            phase = OPTIMIZER if self._updating(func, args, kwargs) else FORWARD
            record = OperationRecord(op_name, phase, stack, module, (call_id, frame_id))
            # The first operation to see a sequence number is the one whose node it is: later
            # operations that create no node see the same counter. The optimizer's run without
            # gradients and create none.
            if phase == FORWARD:
                self._forward_by_sequence.setdefault(next_sequence - 1, record)
        else:
            self._updates.gradients_changed()
            sequence = node._sequence_nr()
            creator = self._forward_by_sequence.get(sequence) if sequence != _NO_SEQUENCE else None
            record = OperationRecord(
                op_name,
                BACKWARD,
                creator.stack if creator else self._backward_callers_stack(),
                creator.module if creator else "",
                node_name=node.name(),
                creator=creator,
            )
            if torch.is_grad_enabled() and threading.get_ident() == self._iteration_thread:
                # Backward work that builds a graph of its own: a reentrant checkpoint's forward run
                # again, or a gradient taken with create_graph=True. The backward of the nodes it
                # creates belongs where it does: to the forward operation whose node it runs. Not
                # on autograd's device threads (CUDA): the sequence counter is per thread, and
                # theirs would name the iteration thread's forward operations.
                self._forward_by_sequence.setdefault(next_sequence - 1, creator or record)
        self.recording.operations.append(record)
        return record

    def _updating(self, func: OpOverload, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        """Whether an operation outside backward is the update's: an optimizer updates without
        gradients (a closure it calls, as LBFGS's, runs the model with them: forward work), a
        GradScaler's work around the step, and work on the gradients or writing the parameters."""
        stepping = self._steps_running and not torch.is_grad_enabled()
        return bool(
            stepping
            or self.call_sites.runs_within(_SCALER_CODES, skip=3)
            or self._updates.is_update(func, args, kwargs)
        )

    def _backward_callers_stack(self) -> tuple[Context, ...]:
        """The project frames of the thread running the iteration, which called backward: on CPU
        autograd runs backward on that thread itself, on CUDA on a device thread of its own."""
        if threading.get_ident() == self._iteration_thread:
            return self.call_sites.stack(skip=3)[0]
        return self.call_sites.stack_from(sys._current_frames().get(self._iteration_thread))[0]

    def _note_made(self, out: Any, args: tuple[Any, ...], kwargs: dict[str, Any], record: OperationRecord) -> None:
        """The storages `record`'s operation made: its outputs' storages that are not its inputs'.
        A view shares its input's storage: `t(weight)`, which every Linear runs, made no weight
        (counted as the activation of `t`, a third of a weight over three recorded iterations, it
        was 40 % of the default example's line). A forward operation is their producer, whose
        activations they are if kept for backward, unless an operation made them before."""
        inputs: set[int] | None = None  # found only when needed: this runs after every operation
        for storage in tensor_storages(tree_flatten(out)[0]):
            produced = record.phase == FORWARD and storage not in self._producer
            if not produced and self.lifetimes is None:
                continue
            if inputs is None:
                inputs = {id(s) for s in tensor_storages(tree_flatten((args, kwargs))[0])}
            if id(storage) in inputs:
                continue
            if produced:
                self._producer[storage] = record
            if self.lifetimes is not None:
                self.lifetimes.made(storage, record)

    @_own_work
    def _pack(self, tensor: torch.Tensor) -> torch.Tensor:
        for storage in tensor_storages([tensor]):
            if self.lifetimes is not None:
                self.lifetimes.accounted(storage, ACTIVATION)
            producer: OperationRecord | None = self._producer.get(storage)
            if producer is not None and storage not in self._saved:
                self._saved[storage] = True
                producer.activation_bytes += storage.nbytes()
        return saved_tensors.kept(tensor)
