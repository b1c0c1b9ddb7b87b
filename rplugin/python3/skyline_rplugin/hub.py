"""The editor's engine: one connection, started on first use and replaced when needed.

A connection is replaced when the engine spec changes (another project root, interpreter or
remote address: the service serves one project root) or when it died, so a crashed engine is
restarted by the next request. Requests are tagged by Lua's generation number (`request`);
`started` events carry it back with the engine's analysis id, which is all Lua needs to drop
results of superseded requests.
"""

from __future__ import annotations

import threading
from typing import Any

from .connection import EngineConnection
from .wire import Emit, Spec

ANALYZE_PARAMS = ("entry_point", "batch_size", "time_limit_s", "memory_capacity_bytes", "world_size", "script_args")


class EngineHub:
    def __init__(self, emit: Emit) -> None:
        self._emit = emit
        self._lock = threading.Lock()
        self._connection: EngineConnection | None = None
        self._started: tuple[int, int] | None = None  # (generation, analysis id) of the latest analysis started
        self._cancel_on_start: int | None = None  # a generation cancelled before its analysis started

    def analyze(self, spec: Spec, request: dict[str, Any]) -> None:
        generation = request["request"]
        params = {key: request[key] for key in ANALYZE_PARAMS if request.get(key) is not None}
        connection = self._current(spec)

        def on_reply(error: dict[str, Any] | None, result: Any) -> None:
            if error is not None:
                self._emit({"event": "request_error", "request": generation, **error})
                return
            analysis_id = result["analysis_id"]
            with self._lock:
                self._started = (generation, analysis_id)
                cancelled = self._cancel_on_start == generation
            if cancelled:
                connection.request("cancel", {"analysis_id": analysis_id})
            self._emit({"event": "started", "request": generation, "analysis_id": analysis_id})

        connection.request("analyze", params, on_reply)

    def cancel(self, generation: int) -> None:
        with self._lock:
            started = self._started if self._started and self._started[0] == generation else None
            if started is None:
                self._cancel_on_start = generation
            connection = self._connection
        if started is not None and connection is not None and not connection.dead:
            connection.request("cancel", {"analysis_id": started[1]})

    def connect(self, spec: Spec) -> None:
        with self._lock:
            self._replace(spec)

    def _current(self, spec: Spec) -> EngineConnection:
        with self._lock:
            connection = self._connection
            if connection is None or connection.dead or connection.spec != spec:
                connection = self._replace(spec)
            return connection

    def _replace(self, spec: Spec) -> EngineConnection:
        if self._connection is not None:
            self._connection.close()
        self._started = self._cancel_on_start = None
        self._connection = EngineConnection(spec, self._emit)
        return self._connection
