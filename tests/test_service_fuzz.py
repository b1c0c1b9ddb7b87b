"""Property-based: random and mutated frames never break the decoder or the dispatcher.

Whatever arrives, the service answers with well-formed messages (error responses or error
notifications) or closes the connection; it never raises. In process, over a fake engine (no
workers), through the same `serve_client` loop the transports use: fast enough for hundreds of
examples. tests/test_service_real_fuzz.py sends the same kinds of frames to the real service.
"""

from __future__ import annotations

import io

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fuzz_frames import assert_well_formed, chunked, message_like, mutated_stream, valid_frames
from service_fakes import dispatcher
from skyline_engine.service.protocol import FatalFrameError, FrameReader
from skyline_engine.service.server import Connection, serve_client

MAX_FRAME = 2048
SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


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
@given(mutated_stream(valid_frames("secret")), st.lists(st.integers(1, 64), max_size=20), st.booleans())
def test_mutated_frames_get_answers_or_a_close(data, sizes, initialized):
    assert_well_formed(run_stream(data, sizes, token="secret", initialized=initialized))


@pytest.mark.slow  # 300 examples, each a dispatcher and its messages: seconds
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
