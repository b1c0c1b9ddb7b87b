"""Peak tensor memory of training iterations, measured, on CUDA and on CPU.

CUDA: the caching allocator's own statistics (`max_memory_allocated`, reset before measuring).

CPU: PyTorch keeps no allocator statistics for CPU tensors, so `TensorMemoryTracker` counts them
itself at the dispatcher: it starts from every tensor alive in the process, adds the storage of
each new tensor an operation returns (forward, backward and optimizer alike) and subtracts it when
that storage is freed. The peak it reports is the largest sum of live tensor storage seen after any
operation. It does not see scratch buffers a kernel allocates and frees internally, nor memory
outside tensors (Python objects, the allocator's own overhead); process RSS would mix all of that
with the interpreter and libraries, which is why it is not used. The tensors alive when it starts
are found through the garbage collector (`LiveTensors`). The counting itself (`StorageCounter`)
also runs inside the breakdown's recorder, so that a recorded iteration is not dispatched twice.
"""

from __future__ import annotations

import contextlib
import gc
import warnings
import weakref
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.weak import WeakIdKeyDictionary


class LiveTensors:
    """Every tensor alive in the process, found through the garbage collector.

    gc finds every tensor that has a Python object: parameters, gradients, optimizer state, inputs,
    and whatever else the user's code keeps alive. A full collection and scan cost about 0.15 s
    each once torch's compiler is imported (creating an optimizer imports it), several times the
    iteration of a small model. `frozen()` moves the objects alive now (torch's modules, the
    engine, the user's model) into the collector's permanent generation, remembering the tensors
    among them through weak references: later collections and scans see only what was created
    since. It also keeps the engine's own objects out of the collections that happen during
    measured iterations.
    """

    def __init__(self) -> None:
        self._frozen: list[weakref.ref[torch.Tensor]] = []

    @contextlib.contextmanager
    def frozen(self) -> Iterator[LiveTensors]:
        gc.collect()
        self._frozen = [weakref.ref(t) for t in _tensors_among(gc.get_objects())]
        gc.freeze()
        try:
            yield self
        finally:
            # Back to the oldest generation, so that cycles among them can be collected again
            # (a warm worker runs many analyses).
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


def _tensors_among(objects: Iterable[Any]) -> list[torch.Tensor]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # looking at arbitrary objects must not surface their warnings
        return [obj for obj in objects if issubclass(type(obj), torch.Tensor)]


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
        if storage in self._sizes:
            return
        size = storage.nbytes()
        self._sizes[storage] = size
        self.live_bytes += size
        # Storage objects are kept alive by PyTorch exactly as long as the storage itself,
        # so the finalizer runs when the memory is released.
        finalizer = weakref.finalize(storage, self._release, size)
        finalizer.atexit = False

    def _release(self, size: int) -> None:
        self.live_bytes -= size


class TensorMemoryTracker(TorchDispatchMode):
    """Live and peak bytes of CPU tensor storage while active: a StorageCounter shown the outputs
    of every operation."""

    def __init__(self, live_tensors: LiveTensors | None = None) -> None:
        super().__init__()  # type: ignore[no-untyped-call]  # torch leaves TorchDispatchMode.__init__ unannotated
        self._live_tensors = live_tensors
        self.counter: StorageCounter | None = None

    def __enter__(self) -> TensorMemoryTracker:
        self.counter = StorageCounter(self._live_tensors)
        entered: TensorMemoryTracker = (
            super().__enter__()  # type: ignore[no-untyped-call]  # torch leaves TorchDispatchMode.__enter__ unannotated
        )
        return entered

    def __torch_dispatch__(
        self,
        func: Callable[..., Any],
        types: Sequence[type],
        args: Sequence[Any] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        out = func(*args, **(kwargs or {}))
        self._entered_counter().add_outputs(out)
        return out

    @property
    def live_bytes(self) -> int:
        return self._entered_counter().live_bytes

    @property
    def peak_bytes(self) -> int:
        return self._entered_counter().peak_bytes

    def _entered_counter(self) -> StorageCounter:
        counter = self.counter
        assert counter is not None, "TensorMemoryTracker counts only once entered (`with`)"
        return counter


def measure_peak_bytes(
    device: torch.device, run_iterations: Callable[[], None], live_tensors: LiveTensors | None = None
) -> int:
    """Peak tensor memory on `device` while `run_iterations` runs."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        run_iterations()
        torch.cuda.synchronize(device)
        return int(torch.cuda.max_memory_allocated(device))
    with TensorMemoryTracker(live_tensors) as tracker:
        run_iterations()
    return int(tracker.peak_bytes)


def release_cached_memory(device: torch.device) -> None:
    """Free what a failed or finished measurement left, so the next batch size starts clean."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def is_out_of_memory(exc: BaseException) -> bool:
    if isinstance(exc, MemoryError):
        return True
    oom_type = getattr(torch.cuda, "OutOfMemoryError", None)
    if oom_type is not None and isinstance(exc, oom_type):
        return True
    text = str(exc)
    return isinstance(exc, RuntimeError) and ("out of memory" in text.lower() or "can't allocate memory" in text)
