"""What an analysis measured of the memory, kept for the next analysis of the same code.

In the editor, a batch-size key rewrites the batch-size literal and re-profiles; a save without a
change to the model re-profiles too. The memory of the other batch sizes, and whether iterations
keep memory for good, do not change with that literal: measured again, the probes took 0.03 s
(the default example), 0.2 s (CNN), 0.45 s (transformer) and 0.9 s (the small GPT) of a warm
analysis, the check for memory kept 3 iterations more. So the service passes the last complete
analysis's `KnownMemory` to the next of the same entry point (docs/protocol.md), and that analysis
takes from it what still holds, and says so in the document (`reused`):

- only where the code is unchanged: the same project files, hashed, with the batch-size literal
  left out (entry/code_digest.py), on the same device and torch;
- and only where the iteration measured now agrees: at the user's batch size its memory, measured
  afresh as always, must have the known operations and a peak within SETTLED_RESIDUAL of the known
  one (or of the known batch sizes' peak-memory model, at a batch size not known) — a config file
  the model is built from, which no digest sees, fails it;
- the memory growth check is skipped only where it found nothing before; a batch size that ran out
  of memory or failed is tried again (nothing of it is kept).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from skyline_engine.analysis.probing import SETTLED_RESIDUAL
from skyline_engine.entry.batch_size import BatchSizeLocation
from skyline_engine.entry.code_digest import CodeDigest, code_digest
from skyline_engine.measure.memory import MemoryProfile
from skyline_engine.predict.peak_memory import PER_OPERATION, fit_peak_memory

# Kept for at most this many batch sizes (the probes, the confirming step's, the largest to fit).
MAX_BATCH_SIZES = 16


@dataclass(frozen=True)
class KnownMemory:
    """The code an analysis ran (`code`), where (`device`: the device's name and torch's version),
    each batch size's memory it measured, and whether it checked that iterations keep no memory
    for good (`no_growth`)."""

    code: CodeDigest
    device: str
    memory: dict[int, MemoryProfile]
    no_growth: bool

    def to_dict(self) -> dict[str, Any]:
        return {
            "code": dict(self.code),
            "device": self.device,
            "memory": [[batch_size, profile.to_dict()] for batch_size, profile in sorted(self.memory.items())],
            "no_growth": self.no_growth,
        }

    @classmethod
    def from_dict(cls, data: Any) -> KnownMemory | None:
        """`to_dict`'s data read back; None where it is not that (it came through a worker that ran
        the user's code: anything is possible)."""
        try:
            code = {str(path): str(digest) for path, digest in data["code"].items()}
            if not all(_inside_the_project(path) for path in code):
                return None
            memory = {}
            for batch_size, profile in data["memory"][:MAX_BATCH_SIZES]:
                if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
                    return None
                memory[batch_size] = MemoryProfile.from_dict(profile)
            return cls(code, str(data["device"]), memory, data["no_growth"] is True)
        except (AttributeError, KeyError, TypeError, ValueError):
            return None

    def unchanged(self, root: Path, literal: BatchSizeLocation | None, device: str) -> bool:
        """Whether the code it was measured from is the code there now, on the same device."""
        return bool(self.code) and device == self.device and code_digest(root, self.code, literal) == self.code

    def agrees(self, batch_size: int, measured: MemoryProfile) -> bool:
        """Whether the iteration measured now at `batch_size` has the memory this knowledge
        predicts: where that batch size is known, its operations and a peak within
        SETTLED_RESIDUAL of its known one; else the operations every known batch size ran and a
        peak within SETTLED_RESIDUAL of their peak-memory model's. (Not the same profile to the
        byte: the first recorded iteration starts with a few bytes more alive than a probe's, 4 of
        10 MiB in the transformer example, and peaks at the same bytes.)"""
        if batch_size in self.memory:
            compared = [self.memory[batch_size]]
        elif len(self.memory) >= 2:
            compared = [profile for _, profile in sorted(self.memory.items())]
        else:
            return False
        if any(
            p.operation_names != measured.operation_names or p.phase_starts != measured.phase_starts for p in compared
        ):
            return False
        if batch_size in self.memory:
            predicted = float(self.memory[batch_size].peak_bytes)
        else:
            model = fit_peak_memory(sorted(self.memory), compared)
            if model.fitted != PER_OPERATION:
                return False
            predicted = model(batch_size)
        return abs(predicted - measured.peak_bytes) <= SETTLED_RESIDUAL * max(measured.peak_bytes, 1)


def _inside_the_project(path: str) -> bool:
    """Whether `path` names a file under the project root, as a digest does: a forged one could name
    /dev/zero, whose hashing would never end."""
    parts = PurePosixPath(path).parts
    return bool(parts) and not PurePosixPath(path).is_absolute() and ".." not in parts


@dataclass
class Reuse:
    """What one analysis takes from a `KnownMemory` that holds for it, and keeps track of what it
    took, for the document."""

    known: KnownMemory | None
    taken: list[int] = field(default_factory=list)  # the batch sizes whose memory it took
    growth_skipped: bool = False

    def growth_known_none(self, batch_size: int, measured: MemoryProfile) -> bool:
        """Whether the memory growth check can be skipped for the iteration measured now (the
        check found nothing in the same code). Decides whether anything is taken: the agreement
        of the user's batch size is checked here, before anything else."""
        if self.known is not None and not self.known.agrees(batch_size, measured):
            self.known = None
        self.growth_skipped = self.known is not None and self.known.no_growth
        return self.growth_skipped

    def knows(self, batch_size: int) -> bool:
        """Whether the memory of `batch_size` is known, not to be measured."""
        return self.known is not None and batch_size in self.known.memory

    def take(self, batch_size: int) -> MemoryProfile:
        """The known memory of `batch_size` (`knows`), taken for the document to say so."""
        assert self.known is not None
        self.taken.append(batch_size)
        return self.known.memory[batch_size]

    def reused(self) -> Reused | None:
        """What the document says was taken (`reused`), None where nothing was."""
        if not self.taken and not self.growth_skipped:
            return None
        return Reused(tuple(sorted(set(self.taken))), self.growth_skipped)


@dataclass(frozen=True)
class Reused:
    """The document's `reused`: the batch sizes whose memory an analysis took from the previous
    analysis of the same code, and whether it skipped the memory growth check."""

    memory_batch_sizes: tuple[int, ...]
    memory_growth_check_skipped: bool

    @property
    def reason(self) -> str:
        parts = []
        if self.memory_batch_sizes:
            listed = ", ".join(f"{b:,}" for b in self.memory_batch_sizes)
            parts.append(f"the memory of batch size{'s' if len(self.memory_batch_sizes) > 1 else ''} {listed}")
        if self.memory_growth_check_skipped:
            parts.append("the check that iterations keep no memory for good")
        return (
            f"Taken from the previous analysis, not measured again: {' and '.join(parts)}. The code is unchanged "
            "since (the batch-size literal aside), and the memory measured now at your batch size agrees."
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "memory_batch_sizes": list(self.memory_batch_sizes),
            "memory_growth_check_skipped": self.memory_growth_check_skipped,
            "reason": self.reason,
        }


def remembered(
    code: CodeDigest | None, device: str, memory: Mapping[int, MemoryProfile], no_growth: bool
) -> KnownMemory | None:
    """What the next analysis may take from this one; None where the code could not be hashed."""
    if code is None or not memory:
        return None
    kept = dict(sorted(memory.items())[:MAX_BATCH_SIZES])
    return KnownMemory(code, device, kept, no_growth)
