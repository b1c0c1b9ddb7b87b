"""The service's shared state: configuration, the worker pool, analysis ids, and shutting down.

Each client gets its own `Dispatcher` (its handshake, its analyses); they all share one
`EngineService`, hence one pool of workers and one sequence of analysis ids.
"""

from __future__ import annotations

import itertools
import logging
import threading
from typing import Any, Callable

from skyline_engine.processes import become_subreaper, remove_stale_cgroups
from skyline_engine.service.config import ServiceConfig
from skyline_engine.service.worker_pool import CGROUP_PREFIX, Job, JobListener, WorkerPool, end_orphans

log = logging.getLogger("skyline.service")


# How often the service looks for orphans (reading its own children list: no scan of /proc).
ORPHAN_REAP_INTERVAL_S = 0.5


class EngineService:
    def __init__(self, config: ServiceConfig) -> None:
        self.config = config
        self.pool = WorkerPool(config)
        self.stopping = threading.Event()
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._on_close: set[Callable[[], None]] = set()

    @property
    def server_root(self) -> str:
        return str(self.config.project_root)

    def start(self) -> None:
        """Warm up the first spare worker, so the first analysis does not wait for torch."""
        # Processes a worker leaves behind when it dies come to the service, to be ended (worker_pool.end_orphans).
        become_subreaper()
        # Those of a service killed before it could remove its workers' cgroups, and what is in them.
        remove_stale_cgroups(CGROUP_PREFIX)
        threading.Thread(target=self._reap_orphans, name="orphan-reaper", daemon=True).start()
        self.pool.start_spare()

    def _reap_orphans(self) -> None:
        """End and reap orphans as they come, not only when an analysis ends: a fork chain left
        behind by a killed worker had gathered 2,450 zombies under the service, whose next answer
        then took 95 s."""
        while not self.stopping.wait(ORPHAN_REAP_INTERVAL_S):
            end_orphans()

    def device(self) -> tuple[dict[str, Any] | None, str | None]:
        return self.pool.device(self.config.worker_start_timeout_s)

    def start_job(self, request: dict[str, Any], listener: JobListener, time_limit_s: float | None) -> Job | None:
        """A job for `request` (not started yet; it takes a fresh worker once it holds the device),
        or None when shutting down."""
        if self.stopping.is_set() or self.pool.closed:
            return None
        with self._lock:
            analysis_id = next(self._ids)
        request = dict(
            request,
            analysis_id=analysis_id,
            project_root=self.server_root,
            device=self.config.device,
            budget=self.config.budget.to_dict(),
        )
        return Job(analysis_id, request, self.pool, listener, time_limit_s or self.config.time_limit_s)

    def on_close(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Run `callback` when the service stops; returns a function that unregisters it."""
        with self._lock:
            self._on_close.add(callback)
        return lambda: self._forget(callback)

    def request_shutdown(self) -> None:
        self.stopping.set()

    def close(self) -> None:
        """End everything: every client's analysis, the spare worker."""
        self.stopping.set()
        with self._lock:
            callbacks = list(self._on_close)
            self._on_close.clear()
        for callback in callbacks:
            try:
                callback()
            except Exception:
                log.exception("while closing")
        self.pool.close()
        end_orphans()  # and the cgroups of workers whose processes had not exited yet

    def _forget(self, callback: Callable[[], None]) -> None:
        with self._lock:
            self._on_close.discard(callback)
