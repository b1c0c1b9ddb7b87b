"""The modules an iteration holds beside the provider's model: an EMA copy of it
(`AveragedModel(model)`, `copy.deepcopy(model)`), a discriminator, a teacher.

The iteration provider builds them and the iteration function keeps them: in its closure, as the
attributes of the object whose method it is (a trainer's `self.ema`), or as a partial's
arguments. Their parameters are weights the iteration keeps alive (a teacher's read as untracked
memory), and writing them in place is update work, as writing the model's is (an EMA update
after the step read as forward time: attribute/updates.py).
"""

from __future__ import annotations

import functools
import itertools
import types
from collections.abc import Iterator
from typing import Any, Callable

import torch

# How far from the iteration function modules are looked for: its closure's values, and their
# attributes (a trainer object's), and the lists and dicts among those...
_DEPTH = 2
# ... and how many items of each list or dict: modules come a few at a time (critics[0], critics[1]),
# while a list of a million samples or a replay buffer would take seconds to walk.
_ITEMS = 64


def modules_held_by(iteration: Callable[..., Any], model: torch.nn.Module) -> dict[str, torch.nn.Module]:
    """The modules `iteration` holds, outermost only, that are not `model` or part of it, by the
    name the code holds each by (`ema`, `critics[1]`, `self.teacher` as `teacher`)."""
    inside = {id(module) for module in model.modules()}
    found: dict[int, tuple[str, torch.nn.Module]] = {}
    for name, module in _modules(_held_values(iteration), _DEPTH, set()):
        if id(module) not in inside:
            found.setdefault(id(module), (name, module))
    return dict(found.values())


def _held_values(function: Any) -> list[tuple[str, Any]]:
    """What a function keeps, by name: its closure's values, a bound method's object's
    attributes, a partial's function and arguments, a callable object's attributes."""
    if isinstance(function, functools.partial):
        positional = [(f"args[{i}]", value) for i, value in enumerate(function.args)]
        return [("func", function.func), *positional, *function.keywords.items()]
    if not isinstance(function, (types.FunctionType, types.MethodType)):
        return _attributes(function)  # an object with __call__
    code = getattr(function, "__code__", None)
    names = code.co_freevars if code is not None else ()
    values = []
    for name, cell in zip(names, getattr(function, "__closure__", None) or ()):
        try:
            values.append((name, cell.cell_contents))
        except ValueError:  # a cell not filled yet
            continue
    if hasattr(function, "__self__"):
        values += _attributes(function.__self__)
    return values


def _modules(values: list[tuple[str, Any]], depth: int, seen: set[int]) -> Iterator[tuple[str, torch.nn.Module]]:
    for name, value in values:
        if id(value) in seen:
            continue
        seen.add(id(value))
        if isinstance(value, torch.nn.Module):
            yield name, value
        elif not depth:
            continue
        elif isinstance(value, (list, tuple)):
            listed = [(f"{name}[{i}]", item) for i, item in enumerate(value[:_ITEMS])]
            yield from _modules(listed, depth - 1, seen)
        elif isinstance(value, dict):
            keyed = [(f"{name}[{key!r}]", item) for key, item in itertools.islice(value.items(), _ITEMS)]
            yield from _modules(keyed, depth - 1, seen)
        elif isinstance(value, (types.FunctionType, types.MethodType, functools.partial)):
            yield from _modules(_held_values(value), depth - 1, seen)
        elif not isinstance(value, (type, types.ModuleType, torch.Tensor)):
            yield from _modules(
                [(f"{name}.{attribute}", item) for attribute, item in _attributes(value)], depth - 1, seen
            )


def _attributes(value: Any) -> list[tuple[str, Any]]:
    try:
        return list(vars(value).items())
    except Exception:  # noqa: BLE001 - no __dict__ (TypeError), or a user's __getattr__ raising anything
        return []
