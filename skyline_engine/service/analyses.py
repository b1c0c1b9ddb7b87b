"""One client's analyses: at most one runs; a newer one supersedes it.

Every message about an analysis passes through one gate (`_deliver`), under one lock: it is sent
only while that analysis is the client's current one and has not ended. So once a new `analyze`
has superseded an analysis, or `cancel` has ended it, nothing more of it reaches the client, even
messages its worker had already written. Each analysis ends with exactly one final notification:
`analysis` with `partial: false`, or `analysis_error` (kind `superseded` or `cancelled` included),
as long as the client is there to receive it: when the service stops (`shutdown`, a signal), the
running analysis ends with `cancelled`; when the client disconnects, its analysis is stopped and
nothing is sent (no one is left to send it to).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Callable

from skyline_engine.service.engine import EngineService
from skyline_engine.service.failures import Failure
from skyline_engine.service.paths import PathMapper
from skyline_engine.service.protocol import SHUTTING_DOWN, RpcError
from skyline_engine.service.worker_pool import Job

Notify = Callable[[str, dict[str, Any]], None]


@dataclass(frozen=True)
class CompleteAnalysis:
    analysis_id: int
    document: dict[str, Any]  # as the engine wrote it: server paths


class ClientAnalyses:
    def __init__(self, engine: EngineService, notify: Notify, mapper: PathMapper) -> None:
        self.engine = engine
        self.notify = notify
        self.mapper = mapper
        self.latest: CompleteAnalysis | None = None
        self._lock = threading.RLock()
        self._current: Job | None = None
        self._open = False  # the current analysis has not ended
        self._closed = False

    def start(
        self, request: dict[str, Any], time_limit_s: float | None, respond: Callable[[dict[str, Any]], None]
    ) -> None:
        """Supersede the running analysis, start a new one; `respond` sends the reply in between,
        so the client learns the new id before any notification about it."""
        with self._lock:
            if self._closed:
                raise RpcError(SHUTTING_DOWN, "the connection is closing")
            job = self.engine.start_job(request, self, time_limit_s)
            if job is None:
                raise RpcError(SHUTTING_DOWN, "the engine is shutting down")
            if self._open and self._current is not None:
                self._end(self._current, "superseded", f"superseded by analysis {job.analysis_id}")
            self._current, self._open = job, True
            respond({"analysis_id": job.analysis_id})
            job.start()

    def cancel(self, analysis_id: int) -> bool:
        """End the analysis if it is the one running; False (and nothing done) otherwise."""
        with self._lock:
            job = self._current
            if not self._open or job is None or job.analysis_id != analysis_id:
                return False
            self._end(job, "cancelled", "cancelled by the client")
            return True

    def running(self) -> Job | None:
        with self._lock:
            return self._current if self._open else None

    def end_for_shutdown(self) -> None:
        """The service stops: the running analysis ends with `analysis_error` kind `cancelled`, and
        no new one starts."""
        with self._lock:
            self._closed = True
            if self._open and self._current is not None:
                self._end(self._current, "cancelled", "cancelled: the service is shutting down")

    def close(self) -> None:
        """The client is gone: stop its analysis without telling anyone."""
        with self._lock:
            self._closed = True
            if self._open and self._current is not None:
                self._open = False
                self._current.stop()

    # --- JobListener: called from the job's thread --------------------------------------------

    def on_progress(self, job: Job, phase: str, fraction: float) -> None:
        self._deliver(job, "progress", {"phase": phase, "fraction": fraction})

    def on_partial(self, job: Job, document: dict[str, Any]) -> None:
        self._deliver(job, "analysis", {"partial": True, "document": self.mapper.to_client(document)})

    def on_result(self, job: Job, document: dict[str, Any]) -> None:
        params = {"partial": False, "document": self.mapper.to_client(document)}
        self._deliver(job, "analysis", params, final=True, complete=CompleteAnalysis(job.analysis_id, document))

    def on_error(self, job: Job, failure: Failure) -> None:
        self._deliver(job, "analysis_error", self.mapper.to_client(failure.to_dict()), final=True)

    # --- the gate ---------------------------------------------------------------------------

    def _deliver(
        self,
        job: Job,
        method: str,
        params: dict[str, Any],
        final: bool = False,
        complete: CompleteAnalysis | None = None,
    ) -> None:
        with self._lock:
            if self._closed or not self._open or job is not self._current:
                return  # superseded, cancelled or ended: never sent as current
            if final:
                self._open = False
            if complete is not None:
                # Kept before the notification leaves: a client that answers it with `predict`
                # at once is served on the requests' thread, which must already see this
                # analysis (on a loaded machine predict answered from the one before).
                self.latest = complete
            self.notify(method, {"analysis_id": job.analysis_id, **params})

    def _end(self, job: Job, kind: str, why: str) -> None:
        self._open = False
        job.stop()
        failure = Failure(kind, f"analysis {job.analysis_id} was {why}.")
        self.notify("analysis_error", {"analysis_id": job.analysis_id, **failure.to_dict()})
