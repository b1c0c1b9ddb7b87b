"""The wire format: msgpack-RPC as Neovim speaks it (docs/protocol.md).

    request       [0, msgid, method, params]
    response      [1, msgid, error, result]
    notification  [2, method, params]

`params` is an array holding one map (or nothing). Frames are plain msgpack objects back to back on
a byte stream; there is no length prefix, so the decoder is a streaming `Unpacker` whose buffer is
bounded: a frame larger than the limit is refused as soon as the buffered part passes it, before it
is complete.

Two kinds of trouble, treated differently:
- the byte stream itself is broken (malformed msgpack, a frame over the limit): after that the
  stream cannot be re-synchronised, so the connection is closed (`FatalFrameError`);
- a well-formed msgpack object that is not a valid message: the stream is still in step, so the
  client gets an error (a response when its msgid is known) and the connection lives on.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Union

import msgpack

REQUEST = 0
RESPONSE = 1
NOTIFICATION = 2

# The remote plugin (rplugin/.../connection.py) keeps the same values (tests/test_parity.py).
PROTOCOL_VERSION = 1
DEFAULT_MAX_FRAME_BYTES = 1 << 20  # requests are small; documents only travel the other way
MAX_MSGID = (1 << 32) - 1

# Error codes (the `code` of an error object).
PARSE_ERROR = "parse_error"
FRAME_TOO_LARGE = "frame_too_large"
INVALID_MESSAGE = "invalid_message"
METHOD_NOT_FOUND = "method_not_found"
INVALID_PARAMS = "invalid_params"
NOT_INITIALIZED = "not_initialized"
ALREADY_INITIALIZED = "already_initialized"
UNSUPPORTED_VERSION = "unsupported_protocol_version"
UNAUTHORIZED = "unauthorized"
HANDSHAKE_TIMEOUT = "handshake_timeout"
NO_MODELS = "no_models"
SHUTTING_DOWN = "shutting_down"
INTERNAL = "internal"


class RpcError(Exception):
    """An error the client is told about: `{code, message}` (+ `param` naming a bad parameter).

    `close` asks the transport to close the connection after sending it (a wrong token).
    """

    def __init__(self, code: str, message: str, param: str | None = None, close: bool = False) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.param = param
        self.close = close

    def to_wire(self) -> dict[str, str]:
        error = {"code": self.code, "message": self.message}
        if self.param is not None:
            error["param"] = self.param
        return error


class FatalFrameError(Exception):
    """The byte stream cannot be decoded any further; the connection must close."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.error = RpcError(code, message, close=True)


@dataclass(frozen=True)
class Request:
    msgid: int
    method: str
    params: dict[str, Any]


@dataclass(frozen=True)
class Notification:
    method: str
    params: dict[str, Any]


class InvalidMessage(Exception):
    """A decoded object that is not a valid message; `msgid` is set when it could be read."""

    def __init__(self, error: RpcError, msgid: int | None = None) -> None:
        super().__init__(error.message)
        self.error = error
        self.msgid = msgid


Message = Union[Request, Notification]


class FrameReader:
    """Bytes in, decoded msgpack objects out; refuses frames above `max_frame_bytes`."""

    def __init__(self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        self.max_frame_bytes = max_frame_bytes
        # strict_map_key=False: a map with integer keys is well-formed msgpack, so it gets an
        # `invalid_params` response instead of breaking the stream.
        self._unpacker = msgpack.Unpacker(raw=False, max_buffer_size=max_frame_bytes, strict_map_key=False)
        self._fed = 0  # bytes fed so far
        self._complete = 0  # stream offset where the last complete object ended

    def feed(self, data: bytes) -> Iterator[Any]:
        """The objects `data` completes, one by one; FatalFrameError when the stream breaks
        (after the objects before the break)."""
        view = memoryview(data)
        while view:
            # Feed no more than the room left for the frame being assembled, so that only a
            # frame that is itself too large can pass the limit (a read may hold many frames).
            room = self.max_frame_bytes - (self._fed - self._complete)
            if room <= 0:
                raise self._too_large()
            chunk, view = view[:room], view[room:]
            try:
                self._unpacker.feed(chunk)
            except msgpack.BufferFull:
                raise self._too_large() from None
            self._fed += len(chunk)
            yield from self._drain()

    def _drain(self) -> Iterator[Any]:
        while True:
            try:
                obj = next(self._unpacker)
            except StopIteration:
                return
            except msgpack.StackError:
                raise FatalFrameError(PARSE_ERROR, "malformed msgpack: nested too deeply") from None
            except Exception as exc:  # noqa: BLE001 - msgpack raises FormatError, ValueError, UnicodeDecodeError…
                text = str(exc)
                if "exceeds max_" in text:
                    raise self._too_large() from None
                raise FatalFrameError(PARSE_ERROR, f"malformed msgpack: {type(exc).__name__}: {text}") from None
            # tell() is exact only between objects (inside one it counts a parsed header too).
            self._complete = self._unpacker.tell()
            yield obj

    def _too_large(self) -> FatalFrameError:
        return FatalFrameError(FRAME_TOO_LARGE, f"a frame is larger than the limit of {self.max_frame_bytes} bytes")


def encode(message: list[Any]) -> bytes:
    data: bytes = msgpack.packb(message, use_bin_type=True)
    return data


def response(msgid: int, error: RpcError | None, result: Any = None) -> list[Any]:
    return [RESPONSE, msgid, error.to_wire() if error is not None else None, result if error is None else None]


def notification(method: str, params: dict[str, Any]) -> list[Any]:
    return [NOTIFICATION, method, [params]]


def parse_message(obj: Any) -> Message:
    """A decoded object as a Request or Notification; raises InvalidMessage otherwise."""
    if not isinstance(obj, list) or not obj:
        raise InvalidMessage(_invalid(f"a message is an array, not {describe_type(obj)}"))
    kind = obj[0]
    if kind == REQUEST and not isinstance(kind, bool):
        return _parse_request(obj)
    if kind == NOTIFICATION and not isinstance(kind, bool):
        if len(obj) != 3:
            raise InvalidMessage(_invalid(f"a notification has 3 elements, not {len(obj)}"))
        method = _method(obj[1], None)
        return Notification(method, _params(obj[2], None))
    if kind == RESPONSE and not isinstance(kind, bool):
        raise InvalidMessage(_invalid("the engine sends no requests, so it accepts no responses"))
    raise InvalidMessage(_invalid(f"unknown message type {kind!r} (0 request, 2 notification)"))


def _parse_request(obj: list[Any]) -> Request:
    msgid = obj[1] if len(obj) > 1 else None
    if isinstance(msgid, bool) or not isinstance(msgid, int) or not 0 <= msgid <= MAX_MSGID:
        raise InvalidMessage(_invalid(f"a request's msgid is an integer from 0 to {MAX_MSGID}, not {msgid!r}"))
    if len(obj) != 4:
        raise InvalidMessage(_invalid(f"a request has 4 elements, not {len(obj)}"), msgid)
    return Request(msgid, _method(obj[2], msgid), _params(obj[3], msgid))


def _method(value: Any, msgid: int | None) -> str:
    if not isinstance(value, str) or not value:
        raise InvalidMessage(_invalid(f"the method is a non-empty string, not {describe_type(value)}"), msgid)
    return value


def _params(value: Any, msgid: int | None) -> dict[str, Any]:
    if not isinstance(value, list) or len(value) > 1:
        raise InvalidMessage(
            RpcError(INVALID_PARAMS, 'params are an array holding one map, e.g. [{"batch_size": 32}]'), msgid
        )
    if not value:
        return {}
    params = value[0]
    if not isinstance(params, dict):
        raise InvalidMessage(RpcError(INVALID_PARAMS, f"params hold a map, not {describe_type(params)}"), msgid)
    for key in params:
        if not isinstance(key, str):
            raise InvalidMessage(RpcError(INVALID_PARAMS, f"parameter names are strings, not {key!r}"), msgid)
    return params


def _invalid(message: str) -> RpcError:
    return RpcError(INVALID_MESSAGE, message)


def describe_type(value: Any) -> str:
    names = {dict: "a map", list: "an array", str: "a string", bytes: "binary data", bool: "a boolean"}
    if value is None:
        return "nil"
    for kind, name in names.items():
        if type(value) is kind:
            return name
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a float"
    return f"a {type(value).__name__}"
