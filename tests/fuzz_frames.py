"""Frames for fuzzing the service: valid ones, random msgpack values, near-miss requests, and
valid streams mutated byte by byte; and the check that whatever the service wrote back is
well-formed. Shared by the in-process fuzz (tests/test_service_fuzz.py) and the one against the
real service (tests/test_service_real_fuzz.py).
"""

from __future__ import annotations

import msgpack
from hypothesis import strategies as st


def valid_frames(token: str, shutdown: bool = True) -> list[list]:
    """One frame of each method; `shutdown=False` leaves out the one that would stop a service
    shared by many examples."""
    frames = [
        [0, 1, "initialize", [{"protocol_version": 1, "token": token, "client_root": "/home/me/p"}]],
        [0, 2, "analyze", [{"entry_point": "tiny/entry_point.py", "batch_size": 16, "time_limit_s": 30}]],
        [0, 3, "predict", [{"batch_size": 64}]],
        [0, 4, "cancel", [{"analysis_id": 1}]],
        [0, 5, "status", []],
        [2, "cancel", [{"analysis_id": 2}]],
    ]
    return [*frames, [0, 6, "shutdown", [{}]]] if shutdown else frames


leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**64 - 1),  # what msgpack can encode
    st.floats(allow_nan=True),
    st.text(max_size=20),
    st.binary(max_size=20),
    st.sampled_from(
        [
            "initialize",
            "analyze",
            "predict",
            "cancel",
            "status",
            "shutdown",
            "entry_point",
            "batch_size",
            "analysis_id",
            "protocol_version",
            "token",
            "client_root",
        ]
    ),
)
msgpack_values = st.recursive(
    leaves,
    lambda children: st.one_of(
        st.lists(children, max_size=5),
        st.dictionaries(st.one_of(st.text(max_size=10), st.integers(-(2**63), 2**64 - 1)), children, max_size=5),
    ),
    max_leaves=20,
)
PARAMETER_NAMES = [
    "protocol_version",
    "token",
    "entry_point",
    "batch_size",
    "analysis_id",
    "client_root",
    "time_limit_s",
]
# Near misses: requests with real method names and parameter names, values of any type.
plausible_requests = st.tuples(
    st.just(0),
    st.integers(0, 2**32),
    st.sampled_from(["initialize", "analyze", "predict", "cancel", "status"]),
    st.lists(st.dictionaries(st.sampled_from(PARAMETER_NAMES), msgpack_values, max_size=4), max_size=2),
).map(list)
message_like = st.one_of(
    msgpack_values,
    st.tuples(st.sampled_from([0, 1, 2, 3]), msgpack_values, msgpack_values, msgpack_values).map(list),
    plausible_requests,
)


@st.composite
def mutated_stream(draw, frames: list[list]):
    """`frames` drawn and encoded back to back, then bytes flipped, inserted, deleted or cut."""
    frames = draw(st.lists(st.sampled_from(frames), min_size=1, max_size=6))
    data = bytearray(b"".join(msgpack.packb(f) for f in frames))
    for _ in range(draw(st.integers(0, 6))):
        op = draw(st.sampled_from(["flip", "insert", "delete", "truncate"]))
        position = draw(st.integers(0, max(len(data) - 1, 0)))
        if op == "flip" and data:
            data[position] ^= draw(st.integers(1, 255))
        elif op == "insert":
            data[position:position] = draw(st.binary(min_size=1, max_size=8))
        elif op == "delete" and data:
            del data[position]
        elif op == "truncate":
            del data[position:]
    return bytes(data)


def chunked(data: bytes, sizes):
    chunks, start = [], 0
    for size in sizes:
        if start >= len(data):
            break
        chunks.append(data[start : start + size])
        start += size
    if start < len(data):
        chunks.append(data[start:])
    return chunks


def assert_well_formed(messages):
    for message in messages:
        assert isinstance(message, list) and message[0] in (1, 2)
        if message[0] == 1:
            _, msgid, error, _ = message
            assert isinstance(msgid, int)
            assert error is None or (isinstance(error["code"], str) and isinstance(error["message"], str))
        else:
            _, method, params = message
            assert isinstance(method, str) and isinstance(params, list) and len(params) == 1
