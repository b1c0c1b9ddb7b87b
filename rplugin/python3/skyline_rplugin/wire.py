"""msgpack framing shared by the engine transports, and shaping events for Lua."""

import msgpack


def encode(message):
    return msgpack.packb(message, use_bin_type=True)


def decoder():
    """A streaming decoder: feed bytes, iterate complete messages."""
    return msgpack.Unpacker(raw=False, strict_map_key=False)


def without_nones(value):
    """`value` with None-valued map entries dropped, recursively.

    pynvim turns None into `vim.NIL`, a truthy userdata that every Lua reader would have to
    special-case; an absent key reads as nil, which is what "unknown" means on the Lua side.
    """
    if isinstance(value, dict):
        return {key: without_nones(item) for key, item in value.items() if item is not None}
    if isinstance(value, list):
        return [without_nones(item) for item in value]
    return value
