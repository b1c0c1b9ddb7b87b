"""What a running service was started with (see `skyline serve --help`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from skyline_engine.service.protocol import DEFAULT_MAX_FRAME_BYTES


@dataclass(frozen=True)
class BudgetOverrides:
    """Changes to the TimingBudget of each analysis; None keeps the engine's default."""

    min_run_s: float | None = None
    max_run_s: float | None = None

    def to_dict(self) -> dict[str, Any]:
        fields = {"min_run_s": self.min_run_s, "max_run_s": self.max_run_s}
        return {key: value for key, value in fields.items() if value is not None}


@dataclass(frozen=True)
class ServiceConfig:
    project_root: Path  # resolved: documents name it as `project_root`
    device: str = "auto"
    # An analysis that runs longer is stopped (its worker killed); `analyze` may ask for less or more.
    time_limit_s: float = 600.0
    # How long a worker may take to start (import torch, find the device) before it is given up.
    worker_start_timeout_s: float = 120.0
    # RLIMIT_AS of each worker, in bytes; None for no limit. It bounds *virtual* memory, so it
    # suits CPU analyses (CUDA reserves large address ranges).
    worker_memory_limit_bytes: int | None = None
    budget: BudgetOverrides = field(default_factory=BudgetOverrides)
    # Workers measure with OpenMP's spin shortened and malloc's thresholds pinned (measure/runtime.py).
    settle_runtime: bool = False
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
    # A TCP client must complete `initialize` within this time, or it is disconnected.
    handshake_timeout_s: float = 10.0
    # A TCP client that does not read what it is sent for this long is disconnected.
    send_timeout_s: float = 60.0
