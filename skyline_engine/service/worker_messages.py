"""What a worker may send the service, checked as untrusted input.

A worker runs the user's code, and that code can write to the worker's message channel (it is an
open file descriptor of the process), so a message may be anything msgpack can hold. Each one is
checked here before the service acts on it: its type, and each field the service uses. A message
that fails ends its analysis with an `analysis_error` of kind `worker_protocol`; nothing of it
reaches the client, and the client's latest complete analysis stays what it was.

    ready     {pid: int, device: map | nil, error: map | nil}
    started   {pid: int}
    progress  {phase: str, fraction: number from 0 to 1}
    partial   {document: map}
    result    {document: map whose `models` (when not nil) `predict` can read,
               imports: list of module names (optional; measure/import_ahead.py),
               known_memory: map or nil (optional; passed to the next worker, which checks it:
               analysis/known_memory.py)}
    error     the fields of a Failure, `kind` one a worker reports

Their order is checked too, by WorkerProcess: `ready` first and once, then `started` once, then
the rest.
"""

from __future__ import annotations

import re
from typing import Any, Callable

from skyline_engine.measure.import_ahead import MAX_MODULES  # a result's `imports`, as a worker names them
from skyline_engine.service.protocol import describe_type, describe_value

# Documents nest about 6 levels; deeper input could make the service's recursive walks (the
# client_root mapping) recurse without end.
MAX_DOCUMENT_DEPTH = 32
MAX_PHASE_CHARS = 500
# A result's `imports`: module names the next worker imports ahead (measure/import_ahead.py).
MODULE_NAME = re.compile(r"[A-Za-z_]\w{0,99}(\.[A-Za-z_]\w{0,99}){0,15}")
# The kinds of `analysis_error` a worker itself reports; the others (crashed, time_limit, cancelled,
# superseded, worker_protocol) only the service can tell.
WORKER_ERROR_KINDS = frozenset({"entry_point", "user_code", "out_of_memory", "worker_start", "error", "internal"})


class WorkerProtocolError(Exception):
    """A message from a worker that breaks the rules above; its text says which rule."""


def check_message(message: Any) -> dict[str, Any]:
    """`message`, checked; raises WorkerProtocolError."""
    if not isinstance(message, dict):
        raise WorkerProtocolError(f"a message is a map, not {describe_type(message)}")
    kind = message.get("type")
    check = _CHECKS.get(kind) if isinstance(kind, str) else None
    if check is None:
        raise WorkerProtocolError(f"unknown message type {describe_value(kind)}")
    check(message)
    return message


def _ready(message: dict[str, Any]) -> None:
    _integer(message, "pid")
    _map_or_nil(message, "device")
    error = _map_or_nil(message, "error")
    if error is not None and not isinstance(error.get("message"), str):
        raise WorkerProtocolError("a `ready` message's `error` has no `message` string")


def _started(message: dict[str, Any]) -> None:
    _integer(message, "pid")


def _progress(message: dict[str, Any]) -> None:
    phase, fraction = message.get("phase"), message.get("fraction")
    if not isinstance(phase, str):
        raise WorkerProtocolError(f"a progress `phase` is a string, not {describe_type(phase)}")
    if len(phase) > MAX_PHASE_CHARS:
        raise WorkerProtocolError(f"a progress `phase` is at most {MAX_PHASE_CHARS} characters long")
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0.0 <= fraction <= 1.0:
        raise WorkerProtocolError(f"a progress `fraction` is a number from 0 to 1, not {describe_value(fraction)}")


def _partial(message: dict[str, Any]) -> None:
    _document(message)


def _result(message: dict[str, Any]) -> None:
    document = _document(message)
    warnings = document.get("warnings")
    if warnings is not None and not (isinstance(warnings, list) and all(isinstance(w, str) for w in warnings)):
        raise WorkerProtocolError("a document's `warnings` are a list of strings")
    if document.get("models") is not None:
        _readable_models(document)
    imports = message.get("imports", [])
    if not (
        isinstance(imports, list)
        and len(imports) <= MAX_MODULES
        and all(isinstance(name, str) and MODULE_NAME.fullmatch(name) for name in imports)
    ):
        raise WorkerProtocolError(f"a result's `imports` are a list of at most {MAX_MODULES} module names")
    _map_or_nil(message, "known_memory")


def _error(message: dict[str, Any]) -> None:
    kind = message.get("kind")
    if kind not in WORKER_ERROR_KINDS:
        raise WorkerProtocolError(f"an error's `kind` is one of {', '.join(sorted(WORKER_ERROR_KINDS))}")
    if not isinstance(message.get("message"), str):
        raise WorkerProtocolError("an error has a `message` string")
    for name in ("path", "signal", "details"):
        if message.get(name) is not None and not isinstance(message[name], str):
            raise WorkerProtocolError(f"an error's `{name}` is a string or nil")
    for name in ("line", "exit_status"):
        if message.get(name) is not None:
            _integer(message, name)


def _document(message: dict[str, Any]) -> dict[str, Any]:
    document = message.get("document")
    if not isinstance(document, dict):
        raise WorkerProtocolError(f"a `{message['type']}` message's document is a map, not {describe_type(document)}")
    if nests_deeper_than(document, MAX_DOCUMENT_DEPTH):
        raise WorkerProtocolError(f"a document nests at most {MAX_DOCUMENT_DEPTH} levels deep")
    return document


def _readable_models(document: dict[str, Any]) -> None:
    """The batch-size models must be what `predict` reads, or a later `predict` would fail."""
    from skyline_engine.predict.batch_models import BatchSizeModels  # numpy: only once a result arrives

    device = document.get("device")
    capacity = device.get("memory_capacity_bytes") if isinstance(device, dict) else None
    if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity <= 0:
        raise WorkerProtocolError("a document with models has a positive `device.memory_capacity_bytes`")
    try:
        models = BatchSizeModels.from_dict(document["models"], capacity)
        models.predict(models.trusted_range[0])
    except Exception as exc:  # noqa: BLE001 - any way the models cannot be read or used
        raise WorkerProtocolError(f"the document's `models` cannot be read: {type(exc).__name__}") from None


def _integer(message: dict[str, Any], name: str) -> int:
    value = message.get(name)
    if isinstance(value, bool) or not isinstance(value, int):
        raise WorkerProtocolError(f"`{name}` is an integer, not {describe_type(value)}")
    return value


def _map_or_nil(message: dict[str, Any], name: str) -> dict[str, Any] | None:
    value = message.get(name)
    if value is not None and not isinstance(value, dict):
        raise WorkerProtocolError(f"`{name}` is a map or nil, not {describe_type(value)}")
    if value is not None and nests_deeper_than(value, MAX_DOCUMENT_DEPTH):
        raise WorkerProtocolError(f"`{name}` nests at most {MAX_DOCUMENT_DEPTH} levels deep")
    return value


def nests_deeper_than(value: Any, limit: int) -> bool:
    """Whether arrays and maps in `value` nest deeper than `limit`; without recursion."""
    pending: list[tuple[Any, int]] = [(value, 0)]
    while pending:
        item, depth = pending.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth + 1 > limit:
            return True
        pending.extend((child, depth + 1) for child in children)
    return False


_CHECKS: dict[str, Callable[[dict[str, Any]], None]] = {
    "ready": _ready,
    "started": _started,
    "progress": _progress,
    "partial": _partial,
    "result": _result,
    "error": _error,
}
