"""One conversation with an engine (docs/protocol.md): handshake, requests, notifications.

Two threads per connection, so that no Neovim handler ever waits on the engine:
- the writer opens the transport (spawning a process or connecting can take a while, or fail),
  then sends what was queued, in order: `initialize` first, then the requests;
- the reader decodes what the engine sends: responses go to the callback of their request,
  notifications are emitted as events as they are.
When the stream ends without `close()`, the engine is gone: that is reported once, and the
connection is dead (the hub starts a new one on the next request).
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
from typing import Any, Callable, Optional

from .transport import EngineUnavailable, Transport, open_transport
from .wire import Emit, Spec, decoder, encode

log = logging.getLogger(__name__)

PROTOCOL_VERSION = 1
REQUEST, RESPONSE, NOTIFICATION = 0, 1, 2

# A request's callback: on_reply(error, result), error being the engine's {code, message} or None.
Reply = Callable[[Optional[dict[str, Any]], Any], None]


class EngineConnection:
    def __init__(self, spec: Spec, emit: Emit) -> None:
        self.spec = spec
        self._emit = emit
        self._outbox: queue.Queue[list[Any] | None] = queue.Queue()
        self._replies: dict[int, Reply] = {}  # msgid -> callback(error, result)
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._closing = False
        self.dead = False
        # First in the queue, before any request the caller adds: the engine demands it.
        self.request("initialize", self._initialize_params(), self._on_initialized)
        threading.Thread(target=self._write_loop, name="skyline-engine-writer", daemon=True).start()

    def request(self, method: str, params: dict[str, Any], on_reply: Reply | None = None) -> None:
        """Queue a request; `on_reply(error, result)` runs on the reader thread."""
        with self._lock:
            msgid = next(self._ids)
            if on_reply is not None:
                self._replies[msgid] = on_reply
        self._outbox.put([REQUEST, msgid, method, [params]])

    def close(self) -> None:
        """End the conversation on purpose: nothing it still receives is emitted (the next
        engine counts analysis ids from 1 again, so a late message could pass for one of its)."""
        self._closing = True
        self._outbox.put(None)

    # --- the writer thread --------------------------------------------------------------------

    def _write_loop(self) -> None:
        try:
            transport = open_transport(self.spec)
        except EngineUnavailable as exc:
            self._die(str(exc))
            return
        threading.Thread(target=self._read_loop, args=(transport,), name="skyline-engine-reader", daemon=True).start()
        while True:
            message = self._outbox.get()
            if message is None or self.dead:
                break
            try:
                transport.write(encode(message))
            except (OSError, ValueError):
                break  # the reader sees the end of the stream and reports it
        transport.close()

    def _initialize_params(self) -> dict[str, Any]:
        params: dict[str, Any] = {"protocol_version": PROTOCOL_VERSION}
        remote = self.spec.get("remote")
        if remote:
            params["token"] = remote.get("token")
            params["client_root"] = self.spec["project_root"]
        return params

    def _on_initialized(self, error: dict[str, Any] | None, result: Any) -> None:
        if error is not None:
            self._die(_initialize_failure(self.spec, error))
            return
        self._emit({"event": "connected", "remote": bool(self.spec.get("remote")), **result})

    # --- the reader thread --------------------------------------------------------------------

    def _read_loop(self, transport: Transport) -> None:
        unpacker = decoder()
        while True:
            data = transport.read()
            if not data:
                break
            unpacker.feed(data)
            try:
                for message in unpacker:
                    self._dispatch(message)
            except Exception as exc:  # a garbled stream cannot be trusted any further
                log.exception("skyline: unreadable message from the engine")
                self._die(f"the engine sent an unreadable message ({type(exc).__name__}: {exc})")
                return
        if not self._closing:
            self._die(transport.describe_end(), ended=True)

    def _dispatch(self, message: list[Any]) -> None:
        if self._closing:
            return
        kind = message[0]
        if kind == RESPONSE:
            _, msgid, error, result = message
            with self._lock:
                on_reply = self._replies.pop(msgid, None)
            if on_reply is not None:
                on_reply(error, result)
        elif kind == NOTIFICATION:
            _, method, params = message
            self._emit({"event": method, **(params[0] if params else {})})

    def _die(self, message: str, ended: bool = False) -> None:
        """Report the failure once; later requests go to a new connection. `ended`: a working
        engine went away (rather than one that could not be reached or refused us)."""
        with self._lock:
            if self.dead or self._closing:
                return
            self.dead = True
        self._outbox.put(None)  # the writer stops and closes the transport
        self._emit({"event": "engine_error", "message": message, "ended": ended})


def _initialize_failure(spec: Spec, error: dict[str, Any]) -> str:
    remote = spec.get("remote")
    where = f"the engine at {remote['host']}:{remote['port']}" if remote else "the engine"
    if error.get("code") == "unauthorized":
        return f"{where} refused the token ({error.get('message')}); check the token file given to :SkylineConnect."
    return f"{where} refused to start a session: {error.get('message')}"
