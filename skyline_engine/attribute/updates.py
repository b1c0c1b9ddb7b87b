"""Telling the update's work apart from the forward pass's, outside `optimizer.step()`.

torch's optimizer step hooks find a step; the rest of an update they do not: gradients clipped
(`clip_grad_norm_`), zeroed in place (`zero_grad(set_to_none=False)`), parameters updated by hand
(`p -= lr * p.grad`, or a torch.func step's detached parameters). Without gradients, that work
looks like forward work, and it was reported as forward time ("fwd 0.35 ms" on a clipping line).

An operation is update work when it reads a parameter's gradient, or a value an update operation
computed (clipping's norms and coefficient), or writes a parameter in place. Reading a parameter is
not enough: the forward pass does, with gradients or without (a frozen backbone under no_grad).
The parameters are the model's and those of the other modules the iteration holds: an EMA copy's
update (`ema.update_parameters(model)`, `e.mul_(d).add_(p, alpha=1 - d)`) is update work too.
Storages are compared by identity and held weakly, so a freed gradient never matches the
activation that reuses its memory.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch._ops import OpOverload
from torch.utils._pytree import tree_flatten
from torch.utils.weak import WeakIdKeyDictionary

from skyline_engine.measure.memory import tensor_storages


class UpdateWork:
    def __init__(self, parameters: list[torch.Tensor]) -> None:
        self._held = parameters  # whose gradients count
        self._parameters = WeakIdKeyDictionary()
        for parameter in parameters:
            _mark(self._parameters, parameter)
        self._gradients: WeakIdKeyDictionary | None = None  # read again after backward ran
        self._derived = WeakIdKeyDictionary()  # storages update operations computed

    @classmethod
    def of(cls, module: torch.nn.Module | None, held: Sequence[torch.nn.Module] = ()) -> UpdateWork:
        """The update of `module`'s parameters and of those of the modules the iteration `held`
        beside it (measure/held_modules.py: an EMA copy written in place after the step)."""
        modules = [*([module] if module is not None else []), *held]
        return cls([parameter for each in modules for parameter in each.parameters()])

    def new_iteration(self) -> None:
        self._gradients = None
        self._derived = WeakIdKeyDictionary()

    def gradients_changed(self) -> None:
        """Backward ran: it may have made new gradients (after `zero_grad(set_to_none=True)`)."""
        self._gradients = None

    def is_update(self, func: OpOverload, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        """Whether `func` on these arguments reads a gradient or an update's value, or writes a
        parameter in place."""
        if not self._held:
            return False
        gradients = self._current_gradients()
        # Most forward operations meet no gradient (zeroed to None) and no update's value: the
        # arguments are not walked then (it cost the recorded iteration 6-9 % more wall time).
        if len(gradients) or len(self._derived):
            for storage in tensor_storages(tree_flatten((args, kwargs))[0]):
                if storage in gradients or storage in self._derived:
                    return True
        return func._schema.is_mutable and any(
            storage in self._parameters for storage in tensor_storages(_written(func, args, kwargs))
        )

    def note_outputs(self, out: Any) -> None:
        """An update operation's outputs: what reads them is update work too. Not the parameters
        an in-place update returns, which the next forward pass reads."""
        for storage in tensor_storages(tree_flatten(out)[0]):
            if storage not in self._parameters:
                self._derived[storage] = True

    def _current_gradients(self) -> WeakIdKeyDictionary:
        if self._gradients is None:
            self._gradients = WeakIdKeyDictionary()
            for parameter in self._held:
                if parameter.grad is not None:
                    _mark(self._gradients, parameter.grad)
        return self._gradients


def _written(func: OpOverload, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Any]:
    """The arguments `func` writes in place (`sub_`'s self, `_foreach_mul_`'s list, an `out=`)."""
    written = []
    for index, argument in enumerate(func._schema.arguments):
        if argument.alias_info is None or not argument.alias_info.is_write:
            continue
        if argument.kwarg_only or index >= len(args):
            if argument.name in kwargs:
                written.append(kwargs[argument.name])
        else:
            written.append(args[index])
    return tree_flatten(written)[0]


def _mark(storages: WeakIdKeyDictionary, tensor: torch.Tensor) -> None:
    for storage in tensor_storages([tensor]):
        storages[storage] = True
