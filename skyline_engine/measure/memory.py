"""Peak tensor memory of training iterations, measured, on CUDA and on CPU.

CUDA: the caching allocator's own statistics (`max_memory_allocated`, reset before measuring).

CPU: PyTorch keeps no allocator statistics for CPU tensors, so `TensorMemoryTracker` counts them
itself at the dispatcher: it starts from every tensor alive in the process, adds the storage of
each new tensor an operation returns (forward, backward and optimizer alike) and subtracts it when
that storage is freed. The peak it reports is the largest sum of live tensor storage seen after any
operation. It does not see scratch buffers a kernel allocates and frees internally, nor memory
outside tensors (Python objects, the allocator's own overhead); process RSS would mix all of that
with the interpreter and libraries, which is why it is not used.
"""

from __future__ import annotations

import gc
import warnings
import weakref
from typing import Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.weak import WeakIdKeyDictionary


class TensorMemoryTracker(TorchDispatchMode):
    """Live and peak bytes of CPU tensor storage while active (see the module docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self._sizes = WeakIdKeyDictionary()
        self.live_bytes = 0
        self.peak_bytes = 0

    def __enter__(self):
        self._count_existing_tensors()
        self.peak_bytes = self.live_bytes
        return super().__enter__()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for value in tree_flatten(out)[0]:
            if isinstance(value, torch.Tensor):
                self._track(value)
        if self.live_bytes > self.peak_bytes:
            self.peak_bytes = self.live_bytes
        return out

    def _count_existing_tensors(self) -> None:
        # gc finds every tensor that has a Python object: parameters, gradients, optimizer state,
        # inputs, and whatever else the user's code keeps alive. Unreachable cycles still waiting
        # for the collector would be found too, so collect them first: they hold no training memory.
        gc.collect()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for obj in gc.get_objects():
                if issubclass(type(obj), torch.Tensor):
                    self._track(obj)

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


def measure_peak_bytes(device: torch.device, run_iterations: Callable[[], None]) -> int:
    """Peak tensor memory on `device` while `run_iterations` runs."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        run_iterations()
        torch.cuda.synchronize(device)
        return int(torch.cuda.max_memory_allocated(device))
    with TensorMemoryTracker() as tracker:
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
    return isinstance(exc, RuntimeError) and (
        "out of memory" in text.lower() or "can't allocate memory" in text
    )
