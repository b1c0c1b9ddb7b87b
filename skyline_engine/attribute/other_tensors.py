"""The other tensors alive at the memory peak, by the line whose operation made them.

The breakdown accounts for the peak with weights, gradients, optimizer state and the activations
each line keeps for backward; the rest was `untracked`, "other tensors". At a peak in the backward
pass those are mostly the gradients flowing back and outputs the user's code still holds: a
language model's logits, held by its output object, and their gradients were 24 MiB of the 77 MiB
peak of a small GPT-2 (Hugging Face transformers), all made at the line that calls the model. The
memory meter only counts bytes, so `Lifetimes` follows the storages the recorded operations make:
when each was made (the operation's index among those the meter saw) and when it was freed (how
many operations the meter had seen by then), so that those alive after the peak's operation can be
named by their line once the peak is known. It also tells the activations kept for backward and
the parameters' gradients apart, and which of them were alive at the peak: the memory's parts at
that moment (attribute/breakdown.py, PeakMemoryParts). A gradient alive when the recording started
(the previous iteration's, freed by `zero_grad()`, or kept by `zero_grad(set_to_none=False)`) is
one of them too, from before the first operation.
"""

from __future__ import annotations

import math
import weakref
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import torch
from torch.utils.weak import WeakIdKeyDictionary

if TYPE_CHECKING:  # the recorder imports this module
    from skyline_engine.attribute.recorder import OperationRecord

# The document names the largest few: the rest are small beside them.
MOST_NAMED = 5

# What a storage the recorder knows is, when it is not one of the other tensors.
ACTIVATION = "activation"  # kept for backward
GRADIENT = "gradient"  # a parameter's gradient
# Before the first operation the meter saw: what was alive when the recording started.
BEFORE_FIRST = -1


@dataclass(frozen=True)
class OtherTensor:
    """Bytes alive at the peak that operations of one line made in one phase, neither kept for
    backward nor a parameter's gradient."""

    path: str
    line: int
    phase: str  # of the operations that made them: forward, backward or optimizer
    bytes: int

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "line": self.line, "phase": self.phase, "bytes": self.bytes}


class Lifetimes:
    """When each storage the recorded operations made was made and freed, counted in operations
    the memory meter saw (`operations_seen`), and which of them are activations or gradients."""

    def __init__(self, operations_seen: Callable[[], int]) -> None:
        self._operations_seen = operations_seen
        self._number = WeakIdKeyDictionary()  # storage -> its index in _made
        # (maker, bytes, index of its operation): no maker for a gradient alive when the recording started
        self._made: list[tuple[OperationRecord | None, int, int]] = []
        self._freed: dict[int, int] = {}  # index in _made -> operations seen when it was freed
        self._kinds: dict[int, str] = {}  # index in _made -> ACTIVATION or GRADIENT: not an other tensor

    def made(self, storage: torch.UntypedStorage, record: OperationRecord) -> None:
        """`record`'s operation, the latest the meter saw, made `storage`."""
        self._note(storage, record, self._operations_seen() - 1)

    def gradient_alive(self, storage: torch.UntypedStorage) -> None:
        """`storage`, a parameter's gradient, is alive as the recording starts."""
        self._note(storage, None, BEFORE_FIRST)
        self.accounted(storage, GRADIENT)

    def accounted(self, storage: torch.UntypedStorage, kind: str) -> None:
        """`storage` is counted elsewhere: an activation kept for backward (ACTIVATION), a
        parameter's gradient (GRADIENT); what it was first told it is, it stays."""
        number = self._number.get(storage)
        if number is not None:
            self._kinds.setdefault(number, kind)

    def alive_at(self, index: int | None) -> dict[str, int]:
        """The bytes of activations and of gradients (by ACTIVATION, GRADIENT) alive right after the
        operation numbered `index` (among those the meter saw); None: before the first."""
        at = BEFORE_FIRST if index is None else index
        alive = dict.fromkeys((ACTIVATION, GRADIENT), 0)
        for number, kind in self._kinds.items():
            _, size, made_at = self._made[number]
            if made_at <= at < self._freed.get(number, math.inf):
                alive[kind] += size
        return alive

    def _note(self, storage: torch.UntypedStorage, record: OperationRecord | None, made_at: int) -> None:
        size = storage.nbytes()
        # A compiler's tracing tensors hold no memory: on `meta`, or of a size with symbols in it.
        if storage in self._number or storage.device.type == "meta" or not isinstance(size, int):
            return
        number = len(self._made)
        self._number[storage] = number
        self._made.append((record, size, made_at))
        # Storage objects live exactly as long as their memory (measure/memory.py).
        weakref.finalize(storage, self._free, number).atexit = False

    def other_tensors_at(self, index: int) -> list[OtherTensor]:
        """What was alive right after the operation numbered `index` (among those the meter saw)
        and is not accounted for elsewhere, by line and phase, largest first, the MOST_NAMED
        largest. Operations at no line of the project are left out."""
        totals: Counter[tuple[str, int, str]] = Counter()
        for number, (record, size, made_at) in enumerate(self._made):
            freed_at = self._freed.get(number, math.inf)
            if number in self._kinds or record is None or record.context is None:
                continue
            if made_at <= index < freed_at:
                path, line = record.context
                totals[path, line, record.phase] += size
        return [OtherTensor(path, line, phase, size) for (path, line, phase), size in totals.most_common(MOST_NAMED)]

    def _free(self, number: int) -> None:
        self._freed[number] = self._operations_seen()
