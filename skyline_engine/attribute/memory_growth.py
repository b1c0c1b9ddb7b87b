"""Memory the iteration keeps for good (measure/retention.py), at the lines that made it, and
what that means for the user and for the batch-size models."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from skyline_engine.attribute.breakdown import OperationSite
from skyline_engine.attribute.recorder import OperationRecord
from skyline_engine.measure.retention import Retention
from skyline_engine.units import format_bytes

# The lines named: those whose operations kept the most.
MAX_LINES = 3
# From this growth per iteration, as a share of the peak, the batch sizes' peaks (measured after
# different numbers of iterations: hundreds are timed between them) are no longer comparable:
# 1,000 iterations add a tenth of the peak.
COMPARABLE_PEAKS = 1e-4


@dataclass(frozen=True)
class KeptAt:
    """The bytes an iteration kept that the operations of one line made (`path` and `line` None:
    operations with no line of the project on their stack)."""

    path: str | None
    line: int | None
    bytes: int

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "line": self.line, "bytes": self.bytes}


@dataclass(frozen=True)
class MemoryGrowth:
    """How much tensor memory each iteration adds for good, and the lines whose operations made
    the most of it (none when the recorded iteration's operations differ from those measured)."""

    bytes_per_iteration: int
    lines: tuple[KeptAt, ...]  # largest first

    def to_dict(self) -> dict[str, Any]:
        return {"bytes_per_iteration": self.bytes_per_iteration, "lines": [kept.to_dict() for kept in self.lines]}

    def warning(self) -> str:
        named = [f"{kept.path}:{kept.line} ({format_bytes(kept.bytes)})" for kept in self.lines if kept.path]
        where = f", made at {', '.join(named)}" if named else ""
        return (
            f"Tensor memory grows by {format_bytes(self.bytes_per_iteration)} with every iteration{where}: what "
            "an iteration makes is still alive two iterations later, so the iteration keeps tensors after it "
            "returns (a list of losses or outputs that keeps their autograd graphs: append `loss.item()` or "
            "`output.detach()`; a graph kept by retain_graph=True). Training like this runs out of memory after "
            "enough iterations at any batch size."
        )

    def skews_peaks(self, peak_bytes: int) -> bool:
        """Whether the growth makes peaks measured after different numbers of iterations incomparable."""
        return self.bytes_per_iteration >= COMPARABLE_PEAKS * peak_bytes


GROWING_MEMORY = (
    "Peak memory grows with every iteration (see the warnings), so each batch size's peak depends on how many "
    "iterations ran before it was measured, and the batch-size models are withheld: keep no tensors across "
    "iterations, then profile again."
)


def memory_growth(
    retention: Retention, recorded_names: Sequence[str], recorded: Sequence[OperationRecord]
) -> MemoryGrowth | None:
    """The growth `retention` found, at the lines of the recorded operations that made it: the
    first recorded iteration's `recorded` operations, whose names (`recorded_names`, as its memory
    profile saw them) must be those the retention measured one for one. None when nothing was kept."""
    if not retention.bytes_per_iteration:
        return None
    if tuple(recorded_names) != retention.operation_names or len(recorded) < len(recorded_names):
        return MemoryGrowth(retention.bytes_per_iteration, ())
    by_line: dict[tuple[str | None, int | None], int] = {}
    for index, size in retention.kept_bytes.items():
        site = OperationSite.of(recorded[index])
        by_line[site.path, site.line] = by_line.get((site.path, site.line), 0) + size
    largest = sorted(by_line.items(), key=lambda kept: -kept[1])[:MAX_LINES]
    return MemoryGrowth(
        retention.bytes_per_iteration, tuple(KeptAt(path, line, size) for (path, line), size in largest)
    )
