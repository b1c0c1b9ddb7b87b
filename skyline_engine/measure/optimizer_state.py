"""Optimizer state that keeps growing after the first step: steady state needs it settled.

Adam, SGD with momentum and the other torch optimizers make all their state in their first step,
which the warm-up runs. LBFGS keeps the updates (two flat vectors the size of all its parameters)
of its last `history_size` (100) inner iterations, up to `max_iter` (20) of them a step, so its
state grows for its first 5 to 100 steps, and its step's time with it (the two-loop recursion
walks the whole history). Measured before the history is full, a peak is neither what training
sees nor comparable with another batch size's, measured after more steps, and the growth reads
as a leak. So the warm-up runs on until a call leaves the optimizers' state as large as it was;
it trusts torch's own optimizers but LBFGS to make all their state in their first step, and
checks any other's with one more call (measure/iteration.py, `warm_up`).
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

# How deep the state's containers are walked: LBFGS's history is a list in the parameter's dict.
_DEPTH = 3


class StepsSeen:
    """The optimizer steps run while counting, and the optimizers that ran them."""

    def __init__(self) -> None:
        self.count = 0
        self._optimizers: weakref.WeakSet[torch.optim.Optimizer] = weakref.WeakSet()

    def stepped(self, optimizer: torch.optim.Optimizer, *_: object) -> None:
        self.count += 1
        self._optimizers.add(optimizer)

    def state_bytes(self) -> int:
        """The bytes the state of the optimizers seen holds, each storage once."""
        storages: dict[int, int] = {}
        for optimizer in list(self._optimizers):
            storages.update(_state_storages(optimizer))
        return sum(storages.values())

    def state_made_in_first_step(self) -> bool:
        """Whether every optimizer seen is one of torch's own that makes all its state in its first
        step: all but LBFGS (see the module docstring). Another's state may still grow."""
        return all(
            type(optimizer).__module__.startswith("torch.optim.") and not isinstance(optimizer, torch.optim.LBFGS)
            for optimizer in list(self._optimizers)
        )

    def history_filling(self) -> bool:
        """Whether an optimizer that keeps a history of a set length (`history_size` in its param
        group: LBFGS's) has not filled it yet. Its state stops growing for a step whose update it
        skips (no positive curvature, on a new batch), and three such steps in a row had ended the
        warm-up with the history half full: a leak of 680 KB an iteration, 1 analysis in 12."""
        for optimizer in list(self._optimizers):
            sizes = [group["history_size"] for group in optimizer.param_groups if "history_size" in group]
            if not sizes:
                continue
            histories = [v for state in optimizer.state.values() for v in state.values() if isinstance(v, list)]
            if not histories or any(len(history) < min(sizes) for history in histories):
                return True
        return False


def state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """The bytes the tensors of `optimizer`'s state hold, each storage once, the lists in it walked
    (LBFGS's history); a sparse tensor's, its indices' and values'."""
    return sum(_state_storages(optimizer).values())


@contextlib.contextmanager
def counting_steps() -> Iterator[StepsSeen]:
    """How many optimizer steps ran meanwhile, and by which optimizers (torch's global optimizer
    step hook)."""
    steps = StepsSeen()
    handle = register_optimizer_step_post_hook(steps.stepped)
    try:
        yield steps
    finally:
        handle.remove()


def _state_storages(optimizer: torch.optim.Optimizer) -> dict[int, int]:
    """The storages of `optimizer`'s state: bytes by address."""
    storages: dict[int, int] = {}
    for tensor in _tensors(optimizer.state.values(), _DEPTH):
        parts = (tensor._indices(), tensor._values()) if tensor.layout == torch.sparse_coo else (tensor,)
        for part in parts:
            storage = part.untyped_storage()
            storages[storage.data_ptr()] = storage.nbytes()
    return storages


def _tensors(values: Iterable[Any], depth: int) -> Iterator[torch.Tensor]:
    for value in values:
        if isinstance(value, torch.Tensor):
            yield value
        elif depth and isinstance(value, dict):
            yield from _tensors(value.values(), depth - 1)
        elif depth and isinstance(value, (list, tuple)):
            yield from _tensors(value, depth - 1)
