"""Whether the input provider follows its `batch_size`: the inputs it made, batch size by batch size.

An input provider that ignores its argument (`torch.randn(16, 256)` under
`def skyline_input_provider(batch_size=16)`) makes every batch size measure the same iteration: a
time line that does not grow, a memory line that does not either, and so throughputs and a
largest batch size that nothing supports. Two batch sizes whose inputs have the same shapes
tell it before their iterations run.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

Shapes = tuple[Any, ...]

# The warning names this many of the inputs' shapes.
SHOWN_SHAPES = 3
# More inputs than this from one call of the input provider: a generator that does not end (taken
# whole, one ran the service out of memory).
MAX_INPUTS = 10_000


class _Opaque(Exception):
    """An input whose size cannot be read from outside (a DataLoader may hold its batch size)."""


def input_shapes(inputs: Sequence[Any]) -> Shapes | None:
    """What the inputs' sizes can depend on, in order: each tensor's shape, each plain value (a
    number may be the batch size itself), the structure of tuples, lists and dicts. None when an
    input is an object whose size cannot be compared, or when there is no tensor at all."""
    leaves: list[Any] = []
    try:
        _walk(inputs, leaves)
    except _Opaque:
        return None
    if not any(isinstance(leaf, torch.Size) for leaf in leaves):
        return None
    return tuple(leaves)


def bounded_inputs(inputs: Iterable[Any]) -> tuple[Any, ...] | None:
    """The inputs as a tuple; None where there are more than MAX_INPUTS (never taken whole)."""
    taken = tuple(itertools.islice(inputs, MAX_INPUTS + 1))
    return None if len(taken) > MAX_INPUTS else taken


def _walk(value: Any, leaves: list[Any]) -> None:
    if isinstance(value, torch.Tensor):
        try:
            leaves.append(value.shape)
        except RuntimeError:  # a nested tensor has no single shape
            raise _Opaque from None
    elif value is None or isinstance(value, (bool, int, float, str)):
        leaves.append(value)
    elif isinstance(value, (tuple, list)):
        leaves.append((type(value).__name__, len(value)))
        for item in value:
            _walk(item, leaves)
    elif isinstance(value, dict):
        leaves.append(("dict", len(value)))
        for key, item in value.items():
            leaves.append(key)
            _walk(item, leaves)
    else:
        raise _Opaque


class InputsIgnoreBatchSize(Exception):
    """The input provider made inputs of the same shapes at two batch sizes."""

    def __init__(self, first: int, second: int, shapes: Shapes) -> None:
        self.batch_sizes = tuple(sorted((first, second)))
        self.shapes = shapes
        super().__init__(f"the same inputs at batch sizes {first} and {second}")

    def warning(self, provider: str, where: str) -> str:
        """Why nothing is predicted, for the document's warnings; `where` is the provider's
        `path:line`."""
        low, high = self.batch_sizes
        shapes = [str(tuple(leaf)) for leaf in self.shapes if isinstance(leaf, torch.Size)]
        tensors = ", ".join(shapes[:SHOWN_SHAPES]) + (", …" if len(shapes) > SHOWN_SHAPES else "")
        return (
            f"`{provider}` ({where}) made inputs of the same shapes at batch sizes {low} and {high} "
            f"(tensors {tensors}): it does not build them from its `batch_size` (or caps it, as a data set "
            "smaller than the batch does), so other batch sizes cannot be measured and nothing is predicted; the "
            "throughput counts the batch size as the samples of an iteration, which holds only if the inputs have "
            "that many. Make `batch_size` their batch dimension, e.g. `torch.randn(batch_size, 256)`."
        )


class InputShapesSeen:
    """The shapes of the inputs made at each batch size, checked as each new one comes."""

    def __init__(self) -> None:
        self._seen: dict[int, Shapes | None] = {}
        self._emptied: set[int] = set()

    def check(self, batch_size: int, inputs: Sequence[Any]) -> None:
        """Remember the inputs' shapes at `batch_size`; InputsIgnoreBatchSize when another batch
        size made the same ones."""
        if batch_size in self._seen:
            return
        shapes = self._seen[batch_size] = input_shapes(inputs)
        if shapes is None:
            return
        for other, seen in self._seen.items():
            if other != batch_size and seen == shapes:
                raise InputsIgnoreBatchSize(other, batch_size, shapes)

    def sampleless(self, batch_size: int) -> torch.Size | None:
        """At the first batch size checked (the user's: it is measured first), the shape of its
        first input tensor where that has no samples (a leading dimension of 0; only the first:
        another empty tensor may be a placeholder, the first carries the batch); None otherwise,
        and where the inputs cannot be read."""
        if batch_size != next(iter(self._seen), None):
            return None
        first = next((leaf for leaf in self._seen[batch_size] or () if isinstance(leaf, torch.Size)), None)
        return first if first is not None and len(first) > 0 and first[0] == 0 else None

    def emptied(self, batch_size: int) -> Emptied | None:
        """An input tensor empty at one of `batch_size` and a batch size seen before it, and not at
        the other: `256 // batch_size` micro-batches make none above 256 (the user's own batch size,
        measured first, may be the empty one). None when there is none (an input empty at every
        batch size is the user's)."""
        shapes = self._seen.get(batch_size)
        for other, seen in self._seen.items():
            if shapes is None or seen is None or len(seen) != len(shapes):
                continue
            for theirs, ours in zip(seen, shapes):
                if not (isinstance(ours, torch.Size) and isinstance(theirs, torch.Size)):
                    continue
                found = None
                if 0 in ours and 0 not in theirs:
                    found = Emptied(batch_size, ours, other, theirs)
                elif 0 in theirs and 0 not in ours:
                    found = Emptied(other, theirs, batch_size, ours)
                if found is not None and found.batch_size not in self._emptied:
                    self._emptied.add(found.batch_size)  # told once: it is left out from then on
                    return found
        return None


@dataclass(frozen=True)
class Emptied:
    """An input empty at `batch_size` (`shape`), with samples at `other` (`other_shape`)."""

    batch_size: int
    shape: torch.Size
    other: int
    other_shape: torch.Size
