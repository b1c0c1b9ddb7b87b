"""The modules an iteration holds beside the provider's model: an EMA copy of it
(`AveragedModel(model)`, `copy.deepcopy(model)`), a discriminator, a teacher.

The iteration provider builds them and the iteration function keeps them: in its closure, as the
attributes of the object whose method it is (a trainer's `self.ema`), or as a partial's
arguments. Writing their parameters in place is update work, as writing the model's is (an EMA
update after the step read as forward time: attribute/updates.py).
"""

from __future__ import annotations

import functools
import types
from collections.abc import Iterator
from typing import Any, Callable

import torch

# How far from the iteration function modules are looked for: its closure's values, and their
# attributes (a trainer object's), and the lists and dicts among those.
_DEPTH = 2


def modules_held_by(iteration: Callable[..., Any], model: torch.nn.Module) -> list[torch.nn.Module]:
    """The modules `iteration` holds, outermost only, that are not `model` or part of it."""
    inside = {id(module) for module in model.modules()}
    found: dict[int, torch.nn.Module] = {}
    for module in _modules(_held_values(iteration), _DEPTH, set()):
        if id(module) not in inside:
            found.setdefault(id(module), module)
    return list(found.values())


def _held_values(function: Any) -> list[Any]:
    """What a function keeps: its closure's values, a bound method's object, a partial's function
    and arguments."""
    if isinstance(function, functools.partial):
        return [function.func, *function.args, *function.keywords.values()]
    values = []
    for cell in getattr(function, "__closure__", None) or ():
        try:
            values.append(cell.cell_contents)
        except ValueError:  # a cell not filled yet
            continue
    if hasattr(function, "__self__"):
        values.append(function.__self__)
    return values


def _modules(values: list[Any], depth: int, seen: set[int]) -> Iterator[torch.nn.Module]:
    for value in values:
        if id(value) in seen:
            continue
        seen.add(id(value))
        if isinstance(value, torch.nn.Module):
            yield value
        elif depth and isinstance(value, (list, tuple)):
            yield from _modules(list(value), depth - 1, seen)
        elif depth and isinstance(value, dict):
            yield from _modules(list(value.values()), depth - 1, seen)
        elif depth and callable(value) and hasattr(value, "__closure__"):
            yield from _modules(_held_values(value), depth - 1, seen)
        elif depth and not isinstance(value, (type, types.ModuleType, torch.Tensor)):
            yield from _modules(_attributes(value), depth - 1, seen)


def _attributes(value: Any) -> list[Any]:
    try:
        return list(vars(value).values())
    except Exception:  # noqa: BLE001 - no __dict__ (TypeError), or a user's __getattr__ raising anything
        return []
