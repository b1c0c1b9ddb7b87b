"""Property-based: random and mutated frames never break the decoder or the dispatcher.

Whatever arrives, the service answers with well-formed messages (error responses or error
notifications) or closes the connection; it never raises. In process, over a fake engine (no
workers), through the same `serve_client` loop the transports use.
"""

from __future__ import annotations

import io

import msgpack
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from service_fakes import dispatcher
from skyline_engine.service.protocol import FatalFrameError, FrameReader
from skyline_engine.service.server import Connection, serve_client

MAX_FRAME = 2048
SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

VALID_FRAMES = [
    [0, 1, "initialize", [{"protocol_version": 1, "token": "secret", "client_root": "/home/me/p"}]],
    [0, 2, "analyze", [{"entry_point": "tiny/entry_point.py", "batch_size": 16, "time_limit_s": 30}]],
    [0, 3, "predict", [{"batch_size": 64}]],
    [0, 4, "cancel", [{"analysis_id": 1}]],
    [0, 5, "status", []],
    [2, "cancel", [{"analysis_id": 2}]],
    [0, 6, "shutdown", [{}]],
]

leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**64) + 1, 2**64 - 1),
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
        st.dictionaries(st.one_of(st.text(max_size=10), st.integers()), children, max_size=5),
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
def mutated_stream(draw):
    """Valid frames, encoded back to back, then bytes flipped, inserted, deleted or cut."""
    frames = draw(st.lists(st.sampled_from(VALID_FRAMES), min_size=1, max_size=6))
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


def run_stream(data: bytes, sizes, token=None, initialized=False):
    """Feed `data` through serve_client as a transport would; returns the messages written back."""
    d, _, _ = dispatcher(token=token)
    out = bytearray()
    connection = Connection(out.extend)
    d._send = connection.send
    if initialized:
        d.handle([0, 0, "initialize", [{"protocol_version": 1, "token": token}]])
    chunks = iter([*chunked(data, sizes), b""])
    serve_client(lambda: next(chunks), connection, d, MAX_FRAME)
    d.close()
    return list(msgpack.Unpacker(io.BytesIO(bytes(out)), raw=False, strict_map_key=False))


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


@SETTINGS
@given(st.binary(max_size=4096), st.lists(st.integers(1, 512), max_size=20))
def test_random_bytes_never_escape_the_decoder(data, sizes):
    reader = FrameReader(MAX_FRAME)
    try:
        for chunk in chunked(data, sizes):
            for _ in reader.feed(chunk):
                pass
    except FatalFrameError as exc:
        assert exc.error.code in ("parse_error", "frame_too_large")


@SETTINGS
@given(st.binary(max_size=4096), st.lists(st.integers(1, 512), max_size=20), st.booleans())
def test_random_bytes_never_escape_the_service_loop(data, sizes, initialized):
    assert_well_formed(run_stream(data, sizes, token="secret", initialized=initialized))


@SETTINGS
@given(mutated_stream(), st.lists(st.integers(1, 64), max_size=20), st.booleans())
def test_mutated_frames_get_answers_or_a_close(data, sizes, initialized):
    assert_well_formed(run_stream(data, sizes, token="secret", initialized=initialized))


@SETTINGS
@given(st.lists(message_like, min_size=1, max_size=8), st.sampled_from([None, "secret"]), st.booleans())
def test_any_decoded_object_gets_at_most_one_response_per_request(objects, token, initialized):
    d, _, sent = dispatcher(token=token)
    if initialized:
        d.handle([0, 0, "initialize", [{"protocol_version": 1, "token": token}]])
    sent.sent.clear()
    for obj in objects:
        before = len(sent.sent)
        keep = d.handle(obj)
        assert isinstance(keep, bool)
        new = sent.sent[before:]
        assert_well_formed(msgpack.unpackb(msgpack.packb(new), raw=False, strict_map_key=False))
        responses = [m for m in new if m[0] == 1]
        is_request = isinstance(obj, list) and len(obj) >= 2 and obj[0] == 0 and not isinstance(obj[0], bool)
        if responses:
            assert is_request and len(responses) == 1 and responses[0][1] == obj[1]
        if not keep:
            break
