"""The analysis document's `distributed` part: data-parallel training's ranks, gradient buckets,
communication and predicted scaling (docs/analysis-document.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from skyline_engine.attribute.breakdown import contexts_to_list
from skyline_engine.attribute.frames import Context
from skyline_engine.predict.scaling import Link, ScalingRow


@dataclass(frozen=True)
class RankMeasurement:
    rank: int
    run_time_ms: float  # an iteration with its all-reduces
    compute_ms: float  # the same iteration without communication (DDP's no_sync)
    peak_memory_bytes: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "run_time_ms": self.run_time_ms,
            "compute_ms": self.compute_ms,
            "peak_memory_bytes": self.peak_memory_bytes,
        }


@dataclass(frozen=True)
class Bucket:
    index: int
    size_bytes: int
    parameters: list[str]
    ready_ms: float
    all_reduce_ms: float
    exposed_ms: float
    lines: list[Context]

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "size_bytes": self.size_bytes,
            "parameters": list(self.parameters),
            "ready_ms": self.ready_ms,
            "all_reduce_ms": self.all_reduce_ms,
            "exposed_ms": self.exposed_ms,
            "lines": contexts_to_list(tuple(self.lines)),
        }


@dataclass(frozen=True)
class DataParallel:
    world_size: int
    backend: str
    threads_per_rank: int
    ranks: list[RankMeasurement]
    buckets: list[Bucket]
    link: Link | None  # None on one rank without a planned link
    scaling: list[ScalingRow]
    backward_end_ms: float  # from the iteration's start: when the last bucket was ready

    @property
    def slowest_rank(self) -> int:
        """The rank whose computation takes longest: the others wait for it at every all-reduce."""
        return max(self.ranks, key=lambda r: r.compute_ms).rank

    @property
    def exposed_ms(self) -> float:
        """What communication adds to the iteration: the slowest rank's iteration with all-reduces
        against the same without."""
        slowest = self.ranks[self.slowest_rank]
        return max(0.0, max(r.run_time_ms for r in self.ranks) - slowest.compute_ms)

    def to_dict(self) -> dict[str, Any]:
        return {
            "world_size": self.world_size,
            "backend": self.backend,
            "threads_per_rank": self.threads_per_rank,
            "ranks": [r.to_dict() for r in self.ranks],
            "slowest_rank": self.slowest_rank,
            "buckets": [b.to_dict() for b in self.buckets],
            "communication": {
                "all_reduce_ms": sum(b.all_reduce_ms for b in self.buckets),
                "exposed_ms": self.exposed_ms,
                "compute_ms": self.ranks[self.slowest_rank].compute_ms,
                "backward_end_ms": self.backward_end_ms,
            },
            "link": self.link.to_dict() if self.link else None,
            "scaling": [row.to_dict() for row in self.scaling],
        }
