"""Tensor memory of training iterations, measured operation by operation, on CUDA and on CPU.

One iteration gives a `MemoryProfile`: the bytes alive when it starts, the peak at each operation,
and where each phase of the iteration starts (the forward and backward passes, the optimizer step,
and the rest, told apart by torch's global module and optimizer hooks). The iteration's peak is
the largest of them; the batch-size models use the whole profile (predict/peak_memory.py).

CUDA: the caching allocator's own statistics: after each operation, the peak since the last one
(`max_memory_allocated`, then `reset_peak_memory_stats`), so a kernel's scratch space counts;
and the bytes allocated right after it (`memory_allocated`), which the scratch space has left.

CPU: PyTorch keeps no allocator statistics for CPU tensors, so a `StorageCounter` counts them at
the dispatcher: it starts from every tensor alive in the process, adds the storage of each new
tensor an operation returns (forward, backward and optimizer alike) and subtracts it when that
storage is freed. It does not see scratch buffers a kernel allocates and frees internally, nor
memory outside tensors (Python objects, the allocator's own overhead); process RSS would mix all
of that with the interpreter and libraries, which is why it is not used. The tensors alive when it
starts are found through the garbage collector (`LiveTensors`). The meter also runs inside the
breakdown's recorder, so that a recorded iteration is not dispatched twice.
"""

from __future__ import annotations

import contextlib
import gc
import warnings
import weakref
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any, Callable

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.weak import WeakIdKeyDictionary

from skyline_engine.measure import saved_tensors
from skyline_engine.measure.compilation import eager_replay
from skyline_engine.vocabulary import FORWARD_BACKWARD, OPTIMIZER, OTHER


@dataclass
class _FrozenImports:
    """Set by `freeze_imports`: the tensors alive when a process that runs one analysis froze what
    it had imported; None where it did not (tests, the bench, `skyline` called as a function)."""

    tensors: list[weakref.ref[torch.Tensor]] | None = None


_frozen_imports = _FrozenImports()


def freeze_imports(collect: bool = True) -> None:
    """For a process that imports what it needs, then runs one analysis and ends (the service's
    warm worker, the command line): the objects alive now (torch, its compiler, the engine) go into
    the collector's permanent generation for good, the tensors among them remembered. Every
    collection and scan of the analysis then walks only what it made: the first,
    `LiveTensors.frozen`'s, held the default example's first per-line result in a warm worker back
    by 0.2 s (0.23 s after the request, 0.03 s without it).

    Both import with the collector off, then call this before turning it on again
    (measure/frozen_imports.py): collecting torch's objects again and again as they were made,
    then once more at the analysis's start, took 0.5-0.7 s of a cold `skyline profile` of the
    default example (4-5 s), 0.02 s after. The worker collects first (`collect`), while it waits
    for its job; the command line, where the analysis would wait for it, keeps what its imports
    left unreachable (8,800 objects, 7 MB, no tensor among them: collecting them takes 0.13 s)."""
    if collect:
        gc.collect()
    _frozen_imports.tensors = [weakref.ref(t) for t in _tensors_among(gc.get_objects())]
    gc.freeze()


class LiveTensors:
    """Every tensor alive in the process, found through the garbage collector.

    gc finds every tensor that has a Python object: parameters, gradients, optimizer state, inputs,
    and whatever else the user's code keeps alive. A full collection and scan cost about 0.15 s
    each once torch's compiler is imported (creating an optimizer imports it), several times the
    iteration of a small model. `frozen()` moves the objects alive now (torch's modules, the
    engine, the user's model) into the collector's permanent generation, remembering the tensors
    among them through weak references: later collections and scans see only what was created
    since. It also keeps the engine's own objects out of the collections that happen during
    measured iterations. Where `freeze_imports` froze what the process imported, the tensors it
    remembered are among them.
    """

    def __init__(self) -> None:
        self._frozen: list[weakref.ref[torch.Tensor]] = []

    @contextlib.contextmanager
    def frozen(self) -> Iterator[LiveTensors]:
        gc.collect()
        imported = _frozen_imports.tensors
        self._frozen = [*(imported or []), *(weakref.ref(t) for t in _tensors_among(gc.get_objects()))]
        gc.freeze()
        try:
            yield self
        finally:
            # Back to the oldest generation, so that cycles among them can be collected again (the
            # command line, the bench and tests run many analyses in one process); a process that
            # froze its imports ends with its analysis, and unfreezing would thaw them too.
            if imported is None:
                gc.unfreeze()
            self._frozen = []

    def __iter__(self) -> Iterator[torch.Tensor]:
        # Unreachable cycles still waiting for the collector would be found too, so collect them
        # first: they hold no training memory.
        gc.collect()
        for ref in self._frozen:
            tensor = ref()
            if tensor is not None:
                yield tensor
        yield from _tensors_among(gc.get_objects())


def _tensors_among(objects: list[Any]) -> list[torch.Tensor]:
    # Each type is asked once, not each object: of the 290,000 objects alive once torch's compiler
    # is imported, a few thousand types; 0.02 s a scan against 0.05 s (a cold analysis scans them all).
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # looking at arbitrary objects must not surface their warnings
        tensor_types = {kind for kind in set(map(type, objects)) if issubclass(kind, torch.Tensor)}
    return [obj for obj in objects if type(obj) in tensor_types]


class StorageCounter:
    """Live and peak bytes of CPU tensor storage (see the module docstring): it starts from every
    tensor alive, then is shown each operation's outputs and hears of each storage freed."""

    def __init__(self, live_tensors: LiveTensors | None = None) -> None:
        self._sizes = WeakIdKeyDictionary()
        self.live_bytes = 0
        for tensor in live_tensors if live_tensors is not None else LiveTensors():
            self._track(tensor)
        self.peak_bytes = self.live_bytes

    def add_outputs(self, out: object) -> None:
        for value in tree_flatten(out)[0]:
            if isinstance(value, torch.Tensor):
                self._track(value)
        if self.live_bytes > self.peak_bytes:
            self.peak_bytes = self.live_bytes

    def _track(self, tensor: torch.Tensor) -> None:
        if tensor.device.type != "cpu" or tensor.is_sparse or tensor.is_nested:
            return
        try:
            storage = tensor.untyped_storage()
        except (RuntimeError, NotImplementedError):
            return
        if storage.device.type != "cpu" or storage in self._sizes:
            # torch.compile's fake tensors claim the CPU as their device, but their storage is on
            # `meta`: they hold no memory (hundreds of MiB of them once a model is compiled).
            return
        size = storage.nbytes()
        if not isinstance(size, int):
            return  # a size with symbols in it: a compiler's tracing tensor, not memory
        self._sizes[storage] = size
        self.live_bytes += size
        # Storage objects are kept alive by PyTorch exactly as long as the storage itself,
        # so the finalizer runs when the memory is released.
        finalizer = weakref.finalize(storage, self._release, size)
        finalizer.atexit = False

    def _release(self, size: int) -> None:
        self.live_bytes -= size


@dataclass(frozen=True)
class MemoryProfile:
    """Tensor memory through one iteration (see the module docstring)."""

    start_bytes: int  # alive when the iteration started
    operation_bytes: tuple[int, ...]  # the peak at each operation, in order
    operation_names: tuple[str, ...]
    phase_starts: tuple[tuple[int, str], ...]  # (index of a phase's first operation, the phase)
    # CUDA: the most the caching allocator reserved from the driver during the iteration (what it
    # holds beyond `peak_bytes` is fragmentation and cache); None on the CPU.
    reserved_peak_bytes: int | None = None
    # CUDA: the bytes allocated right after each operation, without the scratch space its kernel
    # used while it ran (cuDNN's and cuBLAS's workspaces, sized by the algorithm chosen for the
    # shape); None where the meter sees no scratch space (the CPU): the same as operation_bytes.
    operation_held_bytes: tuple[int, ...] | None = None
    # How far the count may stray from the bytes of the tensors alive (CUDA_COUNT_SLACK_BYTES; 0
    # where tensors are counted exactly, on the CPU).
    count_slack_bytes: int = 0
    # Measured as the program runs (`measure_program_memory`): one entry per phase, not per
    # operation; a compiled model's own peak on CUDA.
    program: bool = False

    @property
    def held_bytes(self) -> tuple[int, ...]:
        """The bytes allocated after each operation (tensors, not a kernel's scratch space)."""
        return self.operation_bytes if self.operation_held_bytes is None else self.operation_held_bytes

    @property
    def peak_bytes(self) -> int:
        return max(self.start_bytes, *self.operation_bytes) if self.operation_bytes else self.start_bytes

    def to_dict(self) -> dict[str, Any]:
        """Plain data (msgpack's), for `from_dict` in another process."""
        return {
            "start_bytes": self.start_bytes,
            "operation_bytes": list(self.operation_bytes),
            "operation_names": list(self.operation_names),
            "phase_starts": [list(start) for start in self.phase_starts],
            "reserved_peak_bytes": self.reserved_peak_bytes,
            "operation_held_bytes": None if self.operation_held_bytes is None else list(self.operation_held_bytes),
            "count_slack_bytes": self.count_slack_bytes,
            "program": self.program,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MemoryProfile:
        """`to_dict`'s data read back; ValueError, TypeError or KeyError where it is not that."""
        held = data["operation_held_bytes"]
        profile = cls(
            start_bytes=_count(data["start_bytes"]),
            operation_bytes=tuple(_count(n) for n in data["operation_bytes"]),
            operation_names=tuple(_text(name) for name in data["operation_names"]),
            phase_starts=tuple((_count(index), _text(phase)) for index, phase in data["phase_starts"]),
            reserved_peak_bytes=None if data["reserved_peak_bytes"] is None else _count(data["reserved_peak_bytes"]),
            operation_held_bytes=None if held is None else tuple(_count(n) for n in held),
            count_slack_bytes=_count(data["count_slack_bytes"]),
            program=bool(data["program"]),
        )
        if len(profile.operation_names) != len(profile.operation_bytes) or not profile.phase_starts:
            raise ValueError("a memory profile names each operation and starts a phase")
        return profile

    def phases(self) -> list[str]:
        """The phase of each operation."""
        ends = [start for start, _ in self.phase_starts[1:]] + [len(self.operation_bytes)]
        phases: list[str] = []
        for (start, phase), end in zip(self.phase_starts, ends):
            phases += [phase] * (end - start)
        return phases

    @property
    def peak_phase(self) -> str:
        """The phase in which the peak is reached (the first, on a tie)."""
        if not self.operation_bytes or self.start_bytes >= max(self.operation_bytes):
            return self.phase_starts[0][1]
        return self.phases()[self.operation_bytes.index(max(self.operation_bytes))]


def _count(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"not a count of bytes: {value!r}")
    return value


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"not a name: {value!r}")
    return value


class MemoryMeter:
    """Told of each operation and each change of phase; gives the iteration's MemoryProfile."""

    def __init__(self, start_bytes: int) -> None:
        self.start_bytes = start_bytes
        self.phase = OTHER
        self._bytes: list[int] = []
        self._held: list[int] = []  # where the meter sees scratch space (CUDA)
        self._names: list[str] = []
        self._phase_starts: list[tuple[int, str]] = [(0, OTHER)]

    def enter_phase(self, phase: str) -> None:
        if phase != self.phase:
            self.phase = phase
            self._phase_starts.append((len(self._bytes), phase))

    def after_operation(self, name: str, outputs: object) -> None:
        held = self._held_now()
        if held is not None:
            self._held.append(held)
        self._bytes.append(self._bytes_now(outputs))
        self._names.append(name)

    @property
    def operations_seen(self) -> int:
        return len(self._bytes)

    def profile(self) -> MemoryProfile:
        """The profile so far; phases in which no operation ran are left out."""
        ends = [start for start, _ in self._phase_starts[1:]] + [len(self._bytes)]
        starts = tuple(entry for entry, end in zip(self._phase_starts, ends) if end > entry[0])
        return MemoryProfile(
            self.start_bytes,
            tuple(self._bytes),
            tuple(self._names),
            starts or ((0, OTHER),),
            self._reserved_peak(),
            tuple(self._held) if self._held else None,
            self._count_slack_bytes(),
        )

    def _bytes_now(self, outputs: object) -> int:
        raise NotImplementedError

    def _held_now(self) -> int | None:
        return None

    def _count_slack_bytes(self) -> int:
        return 0

    def _reserved_peak(self) -> int | None:
        return None


class CpuMemoryMeter(MemoryMeter):
    def __init__(self, live_tensors: LiveTensors | None = None) -> None:
        self.counter = StorageCounter(live_tensors)
        super().__init__(self.counter.live_bytes)

    def _bytes_now(self, outputs: object) -> int:
        self.counter.add_outputs(outputs)
        return self.counter.live_bytes


# The caching allocator hands out a cached block up to 1 MiB larger than asked without splitting
# it (it splits off only a remainder of more than 1 MiB) and counts all of it as allocated: on an
# H200 the examples' bytes at one operation strayed up to 1.7 MiB from their lines over batch sizes.
CUDA_COUNT_SLACK_BYTES = 2 << 20


class CudaAllocator:
    """The caching allocator's statistics the meters read (allocation statistics are kept on the
    host, as operations are queued, so reading them needs no synchronisation). The one seam
    between the CUDA meters and the device: tests on a machine without a GPU stand in for it."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def allocated(self) -> int:
        return int(torch.cuda.memory_allocated(self.device))

    def reserved(self) -> int:
        return int(torch.cuda.memory_reserved(self.device))

    def peaks_since_reset(self) -> tuple[int, int]:
        """The most allocated and the most reserved since the last reset, and a reset."""
        peaks = int(torch.cuda.max_memory_allocated(self.device)), int(torch.cuda.max_memory_reserved(self.device))
        torch.cuda.reset_peak_memory_stats(self.device)
        return peaks


class CudaMemoryMeter(MemoryMeter):
    """The allocator's peak during each operation."""

    def __init__(self, device: torch.device, allocator: CudaAllocator | None = None) -> None:
        self.allocator = allocator or CudaAllocator(device)
        self.allocator.peaks_since_reset()
        self._reserved = self.allocator.reserved()
        super().__init__(self.allocator.allocated())

    def _bytes_now(self, outputs: object) -> int:
        peak, reserved = self.allocator.peaks_since_reset()
        # The reset clears the reserved peak too: keep the highest seen.
        self._reserved = max(self._reserved, reserved)
        return peak

    def _reserved_peak(self) -> int | None:
        return self._reserved

    def _held_now(self) -> int | None:
        return self.allocator.allocated()

    def _count_slack_bytes(self) -> int:
        return CUDA_COUNT_SLACK_BYTES


class ProgramPeakMeter(CudaMemoryMeter):
    """The allocator's peak in each phase of an iteration that runs as the program does, no
    dispatch mode in its way: a compiled model's own peak (a dispatch mode sees only an eager
    replay's operations, whose activations the compiler's fused kernels do not all keep). One
    entry per phase, named `<phase> (compiled program)`, at each change of phase and at `finish`.
    The phases are told by the optimizer's steps alone (`tracking_phases` without modules): the
    forward and backward passes until the first step, the step, and what follows it."""

    def __init__(self, device: torch.device, allocator: CudaAllocator | None = None) -> None:
        super().__init__(device, allocator)
        self.phase = FORWARD_BACKWARD
        self._phase_starts = [(0, FORWARD_BACKWARD)]

    def enter_phase(self, phase: str) -> None:
        if phase != self.phase:
            self._end_phase()
        super().enter_phase(phase)

    def finish(self) -> None:
        self._end_phase()

    def _end_phase(self) -> None:
        self.after_operation(f"{self.phase} (compiled program)", None)

    def profile(self) -> MemoryProfile:
        return replace(super().profile(), program=True)


def meter_for(device: torch.device, live_tensors: LiveTensors | None = None) -> MemoryMeter:
    return CudaMemoryMeter(device) if device.type == "cuda" else CpuMemoryMeter(live_tensors)


@contextlib.contextmanager
def tracking_phases(meter: MemoryMeter, modules: bool = True) -> Iterator[MemoryMeter]:
    """Tells `meter` of the iteration's phases through torch's global hooks: the first module
    called starts the forward and backward passes, an optimizer step is the optimizer's phase,
    what follows a step is `other` until a module is called again. Without `modules`, the steps
    alone (a global module hook added around a compiled model makes dynamo compile it again)."""

    def forward(module: torch.nn.Module, args: Any) -> None:
        if meter.phase == OTHER:
            meter.enter_phase(FORWARD_BACKWARD)

    handles = [
        register_optimizer_step_pre_hook(lambda *_: meter.enter_phase(OPTIMIZER)),
        register_optimizer_step_post_hook(lambda *_: meter.enter_phase(OTHER)),
    ]
    if modules:
        handles.append(torch.nn.modules.module.register_module_forward_pre_hook(forward))
    try:
        yield meter
    finally:
        for handle in handles:
            handle.remove()


def tensor_storages(values: Iterable[Any]) -> Iterator[torch.UntypedStorage]:
    """The storages of the tensors among `values` (sparse, nested and the like have none)."""
    for value in values:
        if isinstance(value, torch.Tensor):
            try:
                yield value.untyped_storage()
            except (RuntimeError, NotImplementedError):
                continue


def tensor_bytes(tensor: torch.Tensor) -> int:
    """The bytes of `tensor`'s elements; of a sparse one (a sparse Embedding's gradient), those of
    its indices and values, not of the table it stands for."""
    if tensor.layout == torch.sparse_coo:
        return tensor_bytes(tensor._indices()) + tensor_bytes(tensor._values())
    return tensor.numel() * tensor.element_size()


def gradient_storages(gradient: torch.Tensor) -> Iterator[torch.UntypedStorage]:
    """The storages of a gradient: its own, or a sparse one's indices' and values'."""
    if gradient.layout == torch.sparse_coo:
        yield from tensor_storages([gradient._indices(), gradient._values()])
    else:
        yield from tensor_storages([gradient])


def is_work(func: Any) -> bool:
    """Whether a dispatched operation is work: record_function markers (zero_grad, step) are not."""
    return bool(func.namespace != "profiler")


class MemoryTracker(TorchDispatchMode):
    """Shows `meter` every operation while active."""

    def __init__(self, meter: MemoryMeter) -> None:
        super().__init__()  # type: ignore[no-untyped-call]  # torch leaves TorchDispatchMode.__init__ unannotated
        self.meter = meter

    def __torch_dispatch__(
        self,
        func: Any,
        types: Sequence[type],
        args: Sequence[Any] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        out = func(*args, **(kwargs or {}))
        if is_work(func):
            self.meter.after_operation(func.__name__, out)
        return out


def cublas_workspace_bytes(device: torch.device) -> int:
    """The bytes of the cuBLAS workspaces this process holds on `device` (0 on the CPU).

    cuBLAS allocates a workspace per stream at its first matrix multiplication, through the caching
    allocator, and keeps it: no tensor holds it, so no line of the breakdown can (65 MiB of the
    default example's 72.7 MiB peak on an H200 with torch 2.11). Measured by freeing them, once
    the analysis is done: the next matrix multiplication allocates them again."""
    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)  # in CUDA builds of torch alone
    if device.type != "cuda" or clear is None:
        return 0
    torch.cuda.synchronize(device)
    before = torch.cuda.memory_allocated(device)
    clear()
    return max(0, before - int(torch.cuda.memory_allocated(device)))


def measure_memory(
    device: torch.device, run_iteration: Callable[[], None], live_tensors: LiveTensors | None = None
) -> MemoryProfile:
    """The memory profile of `run_iteration` on `device`.

    Saved-tensor hooks that change nothing are active, as the breakdown's recorder has its own:
    without any, autograd saves some outputs through an extra `detach`, and the profiles of a
    recorded iteration and a measured one would not list the same operations."""
    meter = meter_for(device, live_tensors)
    with eager_replay(), tracking_phases(meter), saved_tensors.unchanged(), MemoryTracker(meter):
        run_iteration()
    return meter.profile()


def measure_program_memory(
    device: torch.device, run_iteration: Callable[[], None], allocator: CudaAllocator | None = None
) -> MemoryProfile:
    """The memory profile of `run_iteration` as the program runs it, on CUDA: the allocator's
    peak in each phase (`ProgramPeakMeter`), no dispatch mode and no eager replay. A compiled
    model's own peak: its fused kernels keep fewer activations than its eager code does."""
    meter = ProgramPeakMeter(device, allocator)
    with tracking_phases(meter, modules=False):
        run_iteration()
    meter.finish()
    return meter.profile()


def release_cached_memory(device: torch.device) -> None:
    """Free what a failed or finished measurement left, so the next batch size starts clean."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


# How allocation failures read when they do not say "out of memory": CPU allocators, and CUDA
# libraries that allocate their own workspaces (cuBLAS handles, cuDNN algorithms).
_ALLOCATION_FAILURES = (
    "out of memory",
    "can't allocate memory",
    "cublas_status_alloc_failed",
    "cudnn_status_alloc_failed",
    "cudaerrormemoryallocation",
)


def address_space_limit() -> int | None:
    """This process's address-space limit in bytes (RLIMIT_AS: the service's
    --worker-memory-limit, or `ulimit -v`), or None when it has none."""
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    return None if soft == resource.RLIM_INFINITY else soft


def is_out_of_memory(exc: BaseException) -> bool:
    if isinstance(exc, MemoryError):
        return True
    oom_type = getattr(torch.cuda, "OutOfMemoryError", None)
    if oom_type is not None and isinstance(exc, oom_type):
        return True
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and any(failure in text for failure in _ALLOCATION_FAILURES)
