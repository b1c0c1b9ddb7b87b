"""Checking a method's parameters: each error names the parameter and says what it must be.

Unknown parameters are ignored, so that a newer client can talk to an older engine.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Callable

from skyline_engine.service.protocol import INVALID_PARAMS, RpcError, describe_value

# The largest batch size a request may name; lua/skyline/constants.lua keeps the same (tests/test_parity.py).
MAX_BATCH_SIZE = (1 << 31) - 1
# The most data-parallel ranks an analysis may run; lua/skyline/config.lua checks only that it is >= 1.
MAX_WORLD_SIZE = 64
# A training script's arguments: as many as a command line holds, each as long as a path.
MAX_SCRIPT_ARGUMENTS = 1000


@dataclass(frozen=True)
class Param:
    name: str
    # Returns the value (maybe converted) or raises ValueError with what the value must be.
    check: Callable[[Any], Any]
    required: bool = False


def validate(params: dict[str, Any], spec: Sequence[Param]) -> dict[str, Any]:
    """The parameters of `spec`, checked; absent optional ones (and nil ones) are None."""
    values: dict[str, Any] = {}
    for param in spec:
        value = params.get(param.name)
        if value is None:
            if param.required:
                raise RpcError(INVALID_PARAMS, f"`{param.name}` is required", param=param.name)
            values[param.name] = None
            continue
        try:
            values[param.name] = param.check(value)
        except ValueError as exc:
            raise RpcError(
                INVALID_PARAMS, f"`{param.name}` must be {exc}, not {describe_value(value)}", param=param.name
            ) from None
    return values


def text(value: Any) -> str:
    if not isinstance(value, str) or not value or "\0" in value:
        raise ValueError("a non-empty string without NUL characters")
    return value


def path_text(value: Any) -> str:
    path = text(value)
    if len(path.encode("utf-8", "surrogatepass")) > 4096:
        raise ValueError("a path of at most 4096 bytes")
    return path


def integer(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError("an integer")
    return value


def batch_size(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_BATCH_SIZE:
        raise ValueError(f"an integer from 1 to {MAX_BATCH_SIZE}")
    return value


def world_size(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_WORLD_SIZE:
        raise ValueError(f"an integer from 1 to {MAX_WORLD_SIZE}")
    return value


def script_arguments(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or len(value) > MAX_SCRIPT_ARGUMENTS or not all(map(_argument, value)):
        raise ValueError(
            f"a list of at most {MAX_SCRIPT_ARGUMENTS} strings without NUL characters, each at most 4096 bytes"
        )
    return tuple(value)


def _argument(value: Any) -> bool:
    return isinstance(value, str) and "\0" not in value and len(value.encode("utf-8", "surrogatepass")) <= 4096


def positive_bytes(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 1 << 62:
        raise ValueError("a positive number of bytes")
    return value


def positive_seconds(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1e7:
        raise ValueError("a positive number of seconds")
    return float(value)
