"""Tensor memory an iteration keeps after it returns, for good: a leak that grows with every
iteration.

The classic one is `losses.append(loss)` after `loss.backward(retain_graph=True)`, or a list of
outputs kept for logging: each iteration's graph, and the activations it saved, stay alive. Peak
memory then depends on how many iterations ran before it was measured (a probe measured after the
timing saw 14 times the user's batch size's peak), and training runs out of memory after enough
iterations whatever the batch size.

In steady state an iteration replaces what it keeps (gradients, the model's output, a detached
hidden state) and never adds to it. So `measure_retention` runs RETENTION_ITERATIONS iterations
in steady state, noting each new storage an operation returns (any device): what the first of
them created and is still alive after all of them (after a garbage collection) survived two whole
iterations that could have replaced it (one would not do: a loss against the output before last
keeps each output through the next iteration). Parameters' gradients are left out: accumulating
them over several iterations before a step keeps them legitimately. And the memory alive must have
grown meanwhile: a bounded window (the last 100 losses, a replay buffer that is full) keeps what
an iteration makes for long, but frees as much of what earlier ones made. On CUDA the allocator
counts what is alive; on the CPU a StorageCounter (measure/memory.py), which sees the storages
alive at the start that Python holds, and every storage made since.

Each survivor keeps the index of the operation that made it, in the order the breakdown's
recorder saw the recorded iteration's operations (the same saved-tensor hooks and eager replay),
so the caller can name its line.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.weak import WeakIdKeyDictionary

from skyline_engine.measure import saved_tensors
from skyline_engine.measure.compilation import eager_replay
from skyline_engine.measure.memory import LiveTensors, StorageCounter, is_work

# The first iteration's survivors must outlive this many iterations in all (itself and two more).
RETENTION_ITERATIONS = 3


@dataclass(frozen=True)
class Retention:
    """What the first of the iterations run created and kept after all of them, when the memory
    alive grew by as much (else nothing)."""

    operation_names: tuple[str, ...]  # the first iteration's operations, in order
    kept_bytes: dict[int, int]  # by the index of the operation that created it, bytes kept

    @property
    def bytes_per_iteration(self) -> int:
        return sum(self.kept_bytes.values())


class _NewStorages(TorchDispatchMode):
    """Remembers each storage an operation newly creates: outputs that share an input's storage
    (in-place operations, views, `out=`) are not new."""

    def __init__(self, counter: StorageCounter | None) -> None:
        super().__init__()  # type: ignore[no-untyped-call]  # torch leaves TorchDispatchMode.__init__ unannotated
        self.counter = counter  # the CPU's bytes alive, shown each operation's outputs
        self.iteration = 0
        self.index = 0  # of the operation within the iteration
        # Storage -> (iteration, operation index, bytes); weak, so that freed storages drop out.
        self.created = WeakIdKeyDictionary()
        self.names: list[str] = []  # the first iteration's operations

    def __torch_dispatch__(
        self,
        func: Any,
        types: Sequence[type],
        args: Sequence[Any] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        out = func(*args, **(kwargs or {}))
        if not is_work(func):
            return out
        inputs = {id(s) for s in _storages(tree_flatten((args, kwargs))[0])}
        for storage in _storages(tree_flatten(out)[0]):
            if id(storage) not in inputs and storage not in self.created:
                self.created[storage] = (self.iteration, self.index, _nbytes(storage))
        if self.counter is not None:
            self.counter.add_outputs(out)
        if self.iteration == 0:
            self.names.append(func.__name__)
        self.index += 1
        return out

    def next_iteration(self) -> None:
        self.iteration += 1
        self.index = 0


def measure_retention(
    run_iteration: Callable[[], None],
    model: torch.nn.Module,
    device: torch.device,
    live_tensors: LiveTensors | None = None,
    iterations: int = RETENTION_ITERATIONS,
) -> Retention:
    """Run `run_iteration` `iterations` times (in steady state) on `device` and return what the
    first kept after all of them, gradients of `model`'s parameters aside, when the memory alive
    grew by as much; `live_tensors` finds the tensors alive at the start (see LiveTensors)."""
    gc.collect()
    counter = StorageCounter(live_tensors) if device.type == "cpu" else None
    start = _alive(device, counter)
    mode = _NewStorages(counter)
    with eager_replay(), saved_tensors.unchanged(), mode:
        for i in range(iterations):
            if i:
                mode.next_iteration()
            run_iteration()
    gc.collect()  # tensors in reference cycles are not kept, only not yet freed
    grown = _alive(device, counter) - start
    gradients = {
        id(storage) for storage in _storages(p.grad for p in model.parameters() if isinstance(p.grad, torch.Tensor))
    }
    kept: dict[int, int] = {}
    for storage, (iteration, index, size) in list(mode.created.items()):
        if iteration == 0 and id(storage) not in gradients:
            kept[index] = kept.get(index, 0) + size
    # A leak grows memory by at least what each iteration keeps (the CUDA allocator rounds blocks
    # up), a bounded window by nothing: half of it tells them apart.
    if grown < iterations * sum(kept.values()) / 2:
        kept = {}
    return Retention(tuple(mode.names), kept)


def _alive(device: torch.device, counter: StorageCounter | None) -> int:
    """Bytes of tensor memory alive now on `device`."""
    if counter is not None:
        return counter.live_bytes
    return int(torch.cuda.memory_allocated(device))


def _storages(values: Any) -> Iterator[torch.UntypedStorage]:
    for value in values:
        if isinstance(value, torch.Tensor) and not value.is_sparse and not value.is_nested:
            try:
                storage = value.untyped_storage()
            except (RuntimeError, NotImplementedError):
                continue
            if storage.device.type != "meta":  # torch.compile's fake tensors hold no memory
                yield storage


def _nbytes(storage: torch.UntypedStorage) -> int:
    size = storage.nbytes()
    return size if isinstance(size, int) else 0  # a size with symbols in it: a tracing tensor
