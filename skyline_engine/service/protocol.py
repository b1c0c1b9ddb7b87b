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
- a well-formed msgpack object that is not a valid message (nesting too deep included): the stream
  is still in step, so the client gets an error (a response when its msgid is known) and the
  connection lives on.

Nesting is limited while the bytes are read, before anything is built: a skimmer walks each frame's
msgpack headers (sizes and element counts, never the contents) to find where it ends and how
deeply it nests. A frame nested deeper than MAX_NESTING_DEPTH is skipped whole, however deep, so
nothing downstream (msgpack's own C stack, `repr`, a recursive walk) ever meets deep input.
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
# Before `initialize` succeeds, frames are smaller still: the largest `initialize` (a 4,096-byte
# client_root, a token) takes under 5 KiB, and an unauthenticated client gets no say in how much
# the service reads and skims for it. At 64 KiB, skimming one frame of small items cost 19-41 ms of
# CPU, and six such peers slowed `status` from 0.2 to 7.7 ms; at 8 KiB, 2.4 ms.
PENDING_MAX_FRAME_BYTES = 8 << 10
MAX_MSGID = (1 << 32) - 1
# The deepest nesting of arrays and maps a frame may have. A request nests 3 levels
# ([0, id, "m", [{"k": v}]]); the room above is for parameters that are themselves arrays or maps.
MAX_NESTING_DEPTH = 32

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
TOO_MANY_CONNECTIONS = "too_many_connections"
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


@dataclass(frozen=True)
class RejectedFrame:
    """A complete, well-formed frame that is not decoded (it nests too deeply): the stream stays
    in step, the client gets `error` (in a response when `msgid` could be read)."""

    error: RpcError
    msgid: int | None = None


# How each msgpack object starts: for every first byte, (kind, bytes of the length field after
# it, value): for _SCALAR the object's whole size, for _BLOB the bytes between the length field and
# the data (an ext's type), for _ARRAY/_MAP the element count of the fix- forms.
_SCALAR, _BLOB, _ARRAY, _MAP, _INVALID = range(5)


def _first_byte(b: int) -> tuple[int, int, int]:
    if b <= 0x7F or b >= 0xE0:  # positive and negative fixint
        return _SCALAR, 0, 1
    if b <= 0x8F:
        return _MAP, 0, b & 0x0F
    if b <= 0x9F:
        return _ARRAY, 0, b & 0x0F
    if b <= 0xBF:  # fixstr
        return _SCALAR, 0, 1 + (b & 0x1F)
    if b in (0xC0, 0xC2, 0xC3):  # nil, false, true
        return _SCALAR, 0, 1
    if 0xC4 <= b <= 0xC6:  # bin 8/16/32
        return _BLOB, 1 << (b - 0xC4), 0
    if 0xC7 <= b <= 0xC9:  # ext 8/16/32: the length, a type byte, the data
        return _BLOB, 1 << (b - 0xC7), 1
    if b in (0xCA, 0xCB):  # float 32/64
        return _SCALAR, 0, 5 if b == 0xCA else 9
    if 0xCC <= b <= 0xD3:  # uint and int 8/16/32/64
        return _SCALAR, 0, 1 + (1 << ((b - 0xCC) % 4))
    if 0xD4 <= b <= 0xD8:  # fixext 1/2/4/8/16: a type byte, the data
        return _SCALAR, 0, 2 + (1 << (b - 0xD4))
    if 0xD9 <= b <= 0xDB:  # str 8/16/32
        return _BLOB, 1 << (b - 0xD9), 0
    if b in (0xDC, 0xDD):
        return _ARRAY, 2 if b == 0xDC else 4, 0
    if b in (0xDE, 0xDF):
        return _MAP, 2 if b == 0xDE else 4, 0
    return _INVALID, 0, 0  # 0xC1: "never used"


_FIRST_BYTES = [_first_byte(b) for b in range(256)]


class FrameReader:
    """Bytes in, decoded msgpack objects out; refuses frames above `max_frame_bytes`, skips (as a
    RejectedFrame) frames nested deeper than MAX_NESTING_DEPTH."""

    def __init__(self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        self.max_frame_bytes = max_frame_bytes
        self._buffer = bytearray()  # from the start of the frame being assembled
        self._pos = 0  # where the skimmer reads the next object header
        self._open: list[int] = []  # per open array or map: how many elements it still lacks
        self._depth = 0  # the deepest nesting seen in this frame

    def feed(self, data: bytes) -> Iterator[Any]:
        """The objects `data` completes, one by one; FatalFrameError when the stream breaks
        (after the objects before the break)."""
        self._buffer += data
        start = 0
        try:
            while True:
                end = self._skim(start)
                if end is None:
                    return
                frame, depth = bytes(self._buffer[start:end]), self._depth
                start, self._depth = end, 0
                yield self._decode(frame, depth)
        finally:
            # Drop what is consumed once per feed (not per frame: a read may hold many frames).
            del self._buffer[:start]
            self._pos -= start

    def _skim(self, start: int) -> int | None:
        """Walk object headers from `self._pos` until the frame that began at `start` is complete:
        its end, or None when more bytes are needed."""
        buffer, stack, pos = self._buffer, self._open, self._pos
        try:
            while pos < len(buffer):
                kind, length_bytes, value = _FIRST_BYTES[buffer[pos]]
                if kind == _INVALID:
                    raise FatalFrameError(
                        PARSE_ERROR, f"malformed msgpack: byte 0x{buffer[pos]:02x} begins no msgpack object"
                    )
                header = 1 + length_bytes
                if not self._available(start, pos + header):
                    return None
                length = int.from_bytes(buffer[pos + 1 : pos + header], "big") if length_bytes else value
                if kind == _SCALAR:
                    size = value
                elif kind == _BLOB:
                    size = header + value + length
                else:
                    size = header
                if not self._available(start, pos + size):
                    return None
                pos += size
                if kind in (_ARRAY, _MAP):
                    self._depth = max(self._depth, len(stack) + 1)
                    count = length * 2 if kind == _MAP else length
                    if count:
                        stack.append(count)
                        continue
                # One value complete: it fills a slot of the innermost open container, which may
                # complete that container in turn.
                while stack:
                    stack[-1] -= 1
                    if stack[-1]:
                        break
                    stack.pop()
                if not stack:
                    return pos
            return None
        finally:
            self._pos = pos

    def _available(self, start: int, end: int) -> bool:
        """Whether the bytes up to `end` are here; a frame that needs more than the limit is
        refused at once, before its bytes arrive."""
        if end - start > self.max_frame_bytes:
            raise self._too_large()
        return end <= len(self._buffer)

    def _decode(self, frame: bytes, depth: int) -> Any:
        if depth > MAX_NESTING_DEPTH:
            error = RpcError(INVALID_MESSAGE, f"a message nests arrays and maps at most {MAX_NESTING_DEPTH} deep")
            return RejectedFrame(error, _request_msgid(frame))
        try:
            # strict_map_key=False: a map with integer keys is well-formed msgpack, so it gets an
            # `invalid_params` response instead of breaking the stream.
            return msgpack.unpackb(frame, raw=False, strict_map_key=False)
        except Exception as exc:  # noqa: BLE001 - msgpack raises FormatError, ValueError, UnicodeDecodeError…
            raise FatalFrameError(PARSE_ERROR, f"malformed msgpack: {type(exc).__name__}: {exc}") from None

    def _too_large(self) -> FatalFrameError:
        return FatalFrameError(FRAME_TOO_LARGE, f"a frame is larger than the limit of {self.max_frame_bytes} bytes")


def _request_msgid(frame: bytes) -> int | None:
    """The msgid of a request too deep to decode, read from its first two elements."""
    unpacker = msgpack.Unpacker(raw=False, strict_map_key=False)
    unpacker.feed(frame)
    try:
        if unpacker.read_array_header() < 2 or unpacker.unpack() != REQUEST:
            return None
        msgid = unpacker.unpack()
    except Exception:  # noqa: BLE001 - not an array, or those elements are themselves too deep
        return None
    valid = isinstance(msgid, int) and not isinstance(msgid, bool) and 0 <= msgid <= MAX_MSGID
    return msgid if valid else None


def encode(message: list[Any]) -> bytes:
    data: bytes = msgpack.packb(message, use_bin_type=True)
    return data


def response(msgid: int, error: RpcError | None, result: Any = None) -> list[Any]:
    return [RESPONSE, msgid, error.to_wire() if error is not None else None, result if error is None else None]


def notification(method: str, params: dict[str, Any]) -> list[Any]:
    return [NOTIFICATION, method, [params]]


def parse_message(obj: Any) -> Message:
    """A decoded object as a Request or Notification; raises InvalidMessage otherwise."""
    if isinstance(obj, RejectedFrame):
        raise InvalidMessage(obj.error, obj.msgid)
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
    raise InvalidMessage(_invalid(f"unknown message type {describe_value(kind)} (0 request, 2 notification)"))


def _parse_request(obj: list[Any]) -> Request:
    msgid = obj[1] if len(obj) > 1 else None
    if isinstance(msgid, bool) or not isinstance(msgid, int) or not 0 <= msgid <= MAX_MSGID:
        raise InvalidMessage(
            _invalid(f"a request's msgid is an integer from 0 to {MAX_MSGID}, not {describe_value(msgid)}")
        )
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
            raise InvalidMessage(
                RpcError(INVALID_PARAMS, f"parameter names are strings, not {describe_value(key)}"), msgid
            )
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


def describe_value(value: Any) -> str:
    """A short, safe description of a value a client sent: a scalar as its (shortened) repr,
    anything else by its type. Never the repr of a container: that can be huge, or recurse."""
    if isinstance(value, (str, int, float)) and not isinstance(value, bool):
        shown = repr(value)
        return (shown[:60] + "…") if len(shown) > 60 else shown
    return describe_type(value)
