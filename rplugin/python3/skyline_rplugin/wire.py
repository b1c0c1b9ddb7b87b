"""msgpack framing shared by the engine transports, and shaping events for Lua."""

from __future__ import annotations

from typing import Any, Callable

import msgpack

# What Lua's `on_message` receives: a map whose `event` names it (an engine notification's method, or
# one of the plugin's own: `connected`, `started`, `request_error`, `engine_error`).
Event = dict[str, Any]
Emit = Callable[[Event], None]
# The engine to use, as Lua describes it: `project_root`, `log_dir`, `python`, `engine_args`, `remote`.
Spec = dict[str, Any]


def encode(message: list[Any]) -> bytes:
    data: bytes = msgpack.packb(message, use_bin_type=True)
    return data


def decoder() -> msgpack.Unpacker:
    """A streaming decoder: feed bytes, iterate complete messages."""
    return msgpack.Unpacker(raw=False, strict_map_key=False)


def without_nones(value: object) -> object:
    """`value` with None-valued map entries dropped, recursively.

    pynvim turns None into `vim.NIL`, a truthy userdata that every Lua reader would have to
    special-case; an absent key reads as nil, which is what "unknown" means on the Lua side.
    """
    if isinstance(value, dict):
        return {key: without_nones(item) for key, item in value.items() if item is not None}
    if isinstance(value, list):
        return [without_nones(item) for item in value]
    return value
