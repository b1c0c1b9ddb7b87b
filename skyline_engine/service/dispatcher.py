"""One client's conversation: the handshake state machine and the method table.

`initialize` comes first, once; every other request before it gets `not_initialized`. Over TCP it
must carry the service's token: a missing or wrong one gets `unauthorized` and the connection
closes. Requests are answered in the order they arrive; analyses report through notifications.

`handle` never raises: whatever the client sends ends as an error response, an error notification
(when no msgid could be read) or a request to close the connection (its return value).
"""

from __future__ import annotations

import logging
import os
from typing import Any, Callable

import skyline_engine
from skyline_engine.service import params as p
from skyline_engine.service.analyses import ClientAnalyses
from skyline_engine.service.engine import EngineService
from skyline_engine.service.paths import PathMapper
from skyline_engine.service.protocol import (
    ALREADY_INITIALIZED,
    INTERNAL,
    METHOD_NOT_FOUND,
    NO_MODELS,
    NOT_INITIALIZED,
    PROTOCOL_VERSION,
    UNAUTHORIZED,
    UNSUPPORTED_VERSION,
    InvalidMessage,
    Notification,
    RpcError,
    describe_value,
    notification,
    parse_message,
    response,
)
from skyline_engine.service.tokens import token_matches

log = logging.getLogger("skyline.service")

Send = Callable[[list[Any]], None]
Respond = Callable[[Any], None]
# A method: its params, and `respond` for a handler that answers before it returns (`analyze`).
Handler = Callable[[dict[str, Any], Respond], Any]

INITIALIZE = [
    p.Param("protocol_version", p.integer, required=True),
    p.Param("token", p.text),
    p.Param("client_root", p.path_text),
]
ANALYZE = [
    p.Param("entry_point", p.path_text, required=True),
    p.Param("batch_size", p.batch_size),
    p.Param("time_limit_s", p.positive_seconds),
    p.Param("memory_capacity_bytes", p.positive_bytes),
    p.Param("world_size", p.world_size),
    p.Param("script_args", p.script_arguments),
]
PREDICT = [p.Param("batch_size", p.batch_size, required=True)]
CANCEL = [p.Param("analysis_id", p.integer, required=True)]


class _Responded:
    """A handler's return value when it has sent its response itself (`analyze`)."""


RESPONDED = _Responded()


class Dispatcher:
    def __init__(
        self, engine: EngineService, send: Send, token: str | None = None, admit: Callable[[], None] = lambda: None
    ) -> None:
        self.engine = engine
        self._send = send
        self._token = token  # None: no token needed (stdio: the editor started us)
        # Called once the token is right, before anything is served: raises RpcError (closing)
        # when the transport has no room for another authenticated client (server.Admission).
        self._admit = admit
        self.initialized = False
        self.analyses: ClientAnalyses | None = None
        self._closed = False
        self._unregister = engine.on_close(self._service_stopping)
        self._methods: dict[str, Handler] = {
            "initialize": self._initialize,
            "analyze": self._analyze,
            "predict": self._predict,
            "cancel": self._cancel,
            "status": self._status,
            "shutdown": self._shutdown,
        }

    def handle(self, obj: Any) -> bool:
        """Act on one decoded frame; False when the connection should close."""
        try:
            message = parse_message(obj)
        except InvalidMessage as exc:
            if exc.msgid is not None:
                self._send(response(exc.msgid, exc.error))
            else:
                self._notify_error(exc.error)
            return True
        if isinstance(message, Notification):
            return self._call(message.method, message.params, None)
        return self._call(message.method, message.params, message.msgid)

    def _service_stopping(self) -> None:
        """The service stops: this client's running analysis ends with its final notification."""
        if self.analyses is not None:
            self.analyses.end_for_shutdown()
        self.close()

    def close(self) -> None:
        """The connection is gone: end this client's analysis, silently."""
        if self._closed:
            return
        self._closed = True
        self._unregister()
        if self.analyses is not None:
            self.analyses.close()

    # --- calling a method -------------------------------------------------------------------

    def _call(self, method: str, params: dict[str, Any], msgid: int | None) -> bool:
        responded = False

        def respond(result: Any) -> None:
            nonlocal responded
            responded = True
            if msgid is not None:
                self._send(response(msgid, None, result))

        try:
            handler = self._handler(method)
            result = handler(params, respond)
            if result is not RESPONDED and not responded:
                respond(result)
            return method != "shutdown"
        except RpcError as error:
            if not responded:  # one response per request, whatever happens after it
                self._reply_error(msgid, error)
            return not error.close
        except Exception as exc:  # a bug: tell the client, keep serving
            log.exception("%s failed", method)
            if not responded:
                self._reply_error(
                    msgid, RpcError(INTERNAL, f"internal error in `{method}`: {type(exc).__name__}: {exc}")
                )
            return True

    def _handler(self, method: str) -> Handler:
        handler = self._methods.get(method)
        if handler is None:
            raise RpcError(
                METHOD_NOT_FOUND,
                f"unknown method {describe_value(method)}; the methods are: {', '.join(self._methods)}",
            )
        if method == "initialize":
            if self.initialized:
                raise RpcError(ALREADY_INITIALIZED, "`initialize` was already called on this connection")
        elif not self.initialized:
            raise RpcError(NOT_INITIALIZED, f"call `initialize` before `{method}`")
        return handler

    def _reply_error(self, msgid: int | None, error: RpcError) -> None:
        if msgid is not None:
            self._send(response(msgid, error))
        else:
            self._notify_error(error)

    def _notify_error(self, error: RpcError) -> None:
        self._send(notification("protocol_error", error.to_wire()))

    def _notify(self, method: str, params: dict[str, Any]) -> None:
        self._send(notification(method, params))

    def _analyses(self) -> ClientAnalyses:
        """This client's analyses; `_handler` lets no method but `initialize`, which sets them, run before."""
        if self.analyses is None:
            raise RpcError(NOT_INITIALIZED, "call `initialize` first")
        return self.analyses

    # --- the methods ------------------------------------------------------------------------

    def _initialize(self, params: dict[str, Any], respond: Respond) -> dict[str, Any]:
        if self._token is not None and not token_matches(self._token, params.get("token")):
            what = "missing" if params.get("token") is None else "wrong"
            raise RpcError(UNAUTHORIZED, f"{what} token; the connection is closed", param="token", close=True)
        args = p.validate(params, INITIALIZE)
        if args["protocol_version"] != PROTOCOL_VERSION:
            raise RpcError(
                UNSUPPORTED_VERSION,
                f"this engine speaks protocol version {PROTOCOL_VERSION}, not {args['protocol_version']}",
                param="protocol_version",
            )
        self._admit()
        mapper = PathMapper(self.engine.server_root, args["client_root"])
        self.analyses = ClientAnalyses(self.engine, self._notify, mapper)
        self.initialized = True
        device, device_error = self.engine.device()
        return {
            "protocol_version": PROTOCOL_VERSION,
            "engine_version": skyline_engine.__version__,
            "server_root": self.engine.server_root,
            "client_root": args["client_root"],
            "device": device,
            "device_error": device_error,
            "pid": os.getpid(),
        }

    def _analyze(self, params: dict[str, Any], respond: Respond) -> _Responded:
        args = p.validate(params, ANALYZE)
        analyses = self._analyses()
        request = {
            "entry_point": analyses.mapper.entry_to_server(args["entry_point"]),
            "batch_size": args["batch_size"],
            "memory_capacity_bytes": args["memory_capacity_bytes"],
            "world_size": args["world_size"] or 1,
            "script_args": list(args["script_args"] or ()),
        }
        analyses.start(request, args["time_limit_s"], respond)
        return RESPONDED

    def _predict(self, params: dict[str, Any], respond: Respond) -> dict[str, Any]:
        from skyline_engine.predict.batch_models import BatchSizeModels  # numpy: only when asked

        args = p.validate(params, PREDICT)
        latest = self._analyses().latest
        if latest is None:
            raise RpcError(NO_MODELS, "no analysis has completed on this connection yet; run `analyze` first")
        document = latest.document
        if document.get("models") is None:
            reason = document.get("models_withheld") or "fewer than two batch sizes could be measured."
            raise RpcError(NO_MODELS, f"analysis {latest.analysis_id} has no batch-size models: {reason}")
        models = BatchSizeModels.from_dict(document["models"], document["device"]["memory_capacity_bytes"])
        batch_size = args["batch_size"]
        prediction = models.predict(batch_size)
        low, high = models.trusted_range
        warning = None
        if batch_size < low:
            warning = (
                f"batch size {batch_size} is below the smallest measured ({low}), where the models are not reliable."
            )
        elif batch_size > high:
            warning = (
                f"batch size {batch_size} is beyond the trusted range (up to {high}, {models.trusted_range_end}): "
                "the prediction is an extrapolation."
            )
        return {"analysis_id": latest.analysis_id, **prediction.to_dict(), "warning": warning}

    def _cancel(self, params: dict[str, Any], respond: Respond) -> dict[str, Any]:
        args = p.validate(params, CANCEL)
        return {"cancelled": self._analyses().cancel(args["analysis_id"])}

    def _status(self, params: dict[str, Any], respond: Respond) -> dict[str, Any]:
        analyses = self._analyses()
        job = analyses.running()
        latest = analyses.latest
        return {
            "analysis_id": job.analysis_id if job else None,
            "worker_pid": job.worker_pid if job else None,
            "spare_worker_pid": self.engine.pool.spare_pid(),
            "latest_complete_analysis_id": latest.analysis_id if latest else None,
        }

    def _shutdown(self, params: dict[str, Any], respond: Respond) -> _Responded:
        # This client's running analysis gets its final notification before the answer; the
        # other clients' get theirs as the service closes (EngineService.close).
        self._analyses().end_for_shutdown()
        respond({})
        self.engine.request_shutdown()
        return RESPONDED
