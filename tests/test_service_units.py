"""The service's parts, in process and fast: framing, message validation, the dispatcher's state
machine and supersession gate (over a fake engine), client_root mapping, tokens, `serve`'s
arguments, and reading faulthandler's stacks.
"""

from __future__ import annotations

import argparse
import io
import stat
from unittest.mock import ANY

import msgpack
import pytest

from service_fakes import DEVICE, dispatcher, document
from skyline_engine.cli.arguments import parse_size
from skyline_engine.cli.serve import is_loopback, parse_listen
from skyline_engine.entry.user_frames import user_frame_in_faulthandler_dump
from skyline_engine.service import failures
from skyline_engine.service.failures import Failure
from skyline_engine.service.paths import PathMapper
from skyline_engine.service.protocol import (
    MAX_NESTING_DEPTH,
    PENDING_MAX_FRAME_BYTES,
    FatalFrameError,
    FrameReader,
    InvalidMessage,
    Notification,
    RejectedFrame,
    Request,
    RpcError,
    parse_message,
)
from skyline_engine.service.server import Admission, Connection, Seat, serve_client
from skyline_engine.service.tokens import (
    default_token_path,
    new_token,
    remove_token_file,
    token_matches,
    write_token_file,
)
from skyline_engine.service.worker_messages import WorkerProtocolError, check_message

# --- framing --------------------------------------------------------------------------------


def test_frames_are_decoded_whatever_the_chunking():
    messages = [[0, i, "status", [{}]] for i in range(50)]
    data = b"".join(msgpack.packb(m) for m in messages)
    for size in (1, 3, 7, 64, len(data)):
        reader = FrameReader(1024)
        decoded = []
        for start in range(0, len(data), size):
            decoded.extend(reader.feed(data[start : start + size]))
        assert decoded == messages


def test_many_small_frames_in_one_read_are_not_too_large():
    data = msgpack.packb([2, "cancel", [{"analysis_id": 1}]]) * 1000
    assert len(list(FrameReader(256).feed(data))) == 1000


def test_a_frame_above_the_limit_is_refused_before_it_completes():
    reader = FrameReader(1024)
    with pytest.raises(FatalFrameError) as caught:
        list(reader.feed(msgpack.packb("x" * 2000)[:1100]))
    assert caught.value.error.code == "frame_too_large"


@pytest.mark.parametrize("garbage", [b"\xc1", b"\xa1\xff", b"\x92\xc0\xc1"])
def test_malformed_msgpack_is_fatal(garbage):
    with pytest.raises(FatalFrameError) as caught:
        list(FrameReader(1 << 20).feed(garbage))
    assert caught.value.error.code == "parse_error"
    assert caught.value.error.close


def nested(depth):
    value = None
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize("depth", [MAX_NESTING_DEPTH + 1, 1000, 100_000])
def test_a_frame_nested_too_deep_is_skipped_whole_and_the_stream_goes_on(depth):
    request = msgpack.packb([0, 1, "status", []])
    data = b"\x91" * depth + b"\xc0" + request
    for size in (1, 7, len(data)):
        reader = FrameReader(1 << 20)
        got = [obj for start in range(0, len(data), size) for obj in reader.feed(data[start : start + size])]
        assert len(got) == 2 and got[1] == [0, 1, "status", []]
        assert isinstance(got[0], RejectedFrame) and got[0].error.code == "invalid_message"


def test_nesting_up_to_the_limit_is_decoded():
    assert list(FrameReader(1024).feed(msgpack.packb(nested(MAX_NESTING_DEPTH)))) == [nested(MAX_NESTING_DEPTH)]
    assert list(FrameReader(1024).feed(msgpack.packb([{"a": [{}]}]))) == [[{"a": [{}]}]]


def test_a_request_too_deep_is_answered_by_its_msgid():
    frame = msgpack.packb([0, 9, "status", [nested(MAX_NESTING_DEPTH)]])
    (rejected,) = FrameReader(1 << 20).feed(frame)
    with pytest.raises(InvalidMessage) as caught:
        parse_message(rejected)
    assert (caught.value.msgid, caught.value.error.code) == (9, "invalid_message")


def test_a_frame_announcing_more_than_the_limit_is_refused_at_its_header():
    with pytest.raises(FatalFrameError) as caught:
        list(FrameReader(1024).feed(b"\xdb\xff\xff\xff\xff"))
    assert caught.value.error.code == "frame_too_large"


@pytest.mark.parametrize(
    "obj", [[nested(5000), 1, "status", []], [0, nested(5000), "status", []], [0, 1, "x", [{(1,) * 5000: 1}]]]
)
def test_errors_never_show_an_untrusted_container(obj):
    with pytest.raises(InvalidMessage) as caught:
        parse_message(obj)
    assert len(caught.value.error.message) < 200


def test_an_unknown_method_is_named_in_at_most_60_characters():
    d, _, sent = dispatcher()
    error = call(d, sent, "x" * 100_000)[0]
    assert error["code"] == "method_not_found" and len(error["message"]) < 200


def test_objects_before_a_break_are_still_delivered():
    reader = FrameReader(1024)
    got = []
    with pytest.raises(FatalFrameError):
        for obj in reader.feed(msgpack.packb([0, 1, "status", []]) + b"\xc1"):
            got.append(obj)
    assert got == [[0, 1, "status", []]]


# --- messages -------------------------------------------------------------------------------


def test_requests_and_notifications_are_parsed():
    assert parse_message([0, 7, "predict", [{"batch_size": 8}]]) == Request(7, "predict", {"batch_size": 8})
    assert parse_message([0, 7, "status", []]) == Request(7, "status", {})
    assert parse_message([2, "cancel", [{"analysis_id": 3}]]) == Notification("cancel", {"analysis_id": 3})


@pytest.mark.parametrize(
    "obj, msgid, code",
    [
        (5, None, "invalid_message"),
        ([], None, "invalid_message"),
        ([0, "one", "status", []], None, "invalid_message"),
        ([0, -1, "status", []], None, "invalid_message"),
        ([0, 2**32, "status", []], None, "invalid_message"),
        ([0, True, "status", []], None, "invalid_message"),
        ([0, 1, "status"], 1, "invalid_message"),
        ([0, 1, b"status", []], 1, "invalid_message"),
        ([0, 1, "status", {"a": 1}], 1, "invalid_params"),
        ([0, 1, "status", [{}, {}]], 1, "invalid_params"),
        ([0, 1, "status", [[1]]], 1, "invalid_params"),
        ([0, 1, "status", [{1: 2}]], 1, "invalid_params"),
        ([1, 1, None, None], None, "invalid_message"),
        ([3, "x"], None, "invalid_message"),
        ([False, 1, "status", []], None, "invalid_message"),
    ],
)
def test_invalid_messages_say_why_and_keep_the_msgid_when_known(obj, msgid, code):
    with pytest.raises(InvalidMessage) as caught:
        parse_message(obj)
    assert caught.value.msgid == msgid
    assert caught.value.error.code == code


# --- the dispatcher ---------------------------------------------------------------------------


def call(d, sent, method, params=None, msgid=1):
    keep = d.handle([0, msgid, method, [params] if params is not None else []])
    response = sent.responses()[-1]
    assert response[1] == msgid
    return response[2], response[3], keep


def test_initialize_first_and_once():
    d, _, sent = dispatcher()
    assert call(d, sent, "predict", {"batch_size": 4})[0]["code"] == "not_initialized"
    error, result, _ = call(d, sent, "initialize", {"protocol_version": 1})
    assert error is None and result["device"] == DEVICE and result["server_root"] == "/srv/project"
    assert call(d, sent, "initialize", {"protocol_version": 1})[0]["code"] == "already_initialized"


def test_initialize_checks_its_parameters():
    d, _, sent = dispatcher()
    error = call(d, sent, "initialize", {})[0]
    assert (error["code"], error["param"]) == ("invalid_params", "protocol_version")
    error = call(d, sent, "initialize", {"protocol_version": "1"})[0]
    assert (error["code"], error["param"]) == ("invalid_params", "protocol_version")
    assert call(d, sent, "initialize", {"protocol_version": 2})[0]["code"] == "unsupported_protocol_version"
    assert not d.initialized


@pytest.mark.parametrize("token", [None, "nope", 7, ["secret"]])
def test_a_missing_or_wrong_token_closes(token):
    d, _, sent = dispatcher(token="secret")
    params = {"protocol_version": 1}
    if token is not None:
        params["token"] = token
    error, _, keep = call(d, sent, "initialize", params)
    assert error["code"] == "unauthorized"
    assert keep is False
    assert not d.initialized


def test_the_right_token_opens():
    d, _, sent = dispatcher(token="secret")
    error, _, keep = call(d, sent, "initialize", {"protocol_version": 1, "token": "secret"})
    assert error is None and keep and d.initialized


def initialized(client_root=None):
    d, engine, sent = dispatcher()
    params = {"protocol_version": 1}
    if client_root:
        params["client_root"] = client_root
    assert call(d, sent, "initialize", params)[0] is None
    return d, engine, sent


@pytest.mark.parametrize("capacity", [0, -1, 1.5, True, "24GiB"])
def test_a_capacity_is_a_positive_number_of_bytes(capacity):
    d, _, sent = initialized()
    error, _, _ = call(d, sent, "analyze", {"entry_point": "tiny/entry_point.py", "memory_capacity_bytes": capacity})
    assert (error["code"], error["param"]) == ("invalid_params", "memory_capacity_bytes")


def test_a_capacity_reaches_the_worker():
    d, engine, _ = initialized()
    d.handle([0, 2, "analyze", [{"entry_point": "tiny/entry_point.py", "memory_capacity_bytes": 24 << 30}]])
    assert engine.jobs[0].request["memory_capacity_bytes"] == 24 << 30


@pytest.mark.parametrize("world_size", [0, -1, 65, 1.5, True, "2"])
def test_a_world_size_is_an_integer_from_1_to_64(world_size):
    d, engine, sent = initialized()
    error, _, _ = call(d, sent, "analyze", {"entry_point": "tiny/entry_point.py", "world_size": world_size})
    assert (error["code"], error["param"]) == ("invalid_params", "world_size")
    assert "an integer from 1 to 64" in error["message"]
    assert not engine.jobs


@pytest.mark.parametrize("world_size", [1, 2, 64])
def test_a_world_size_reaches_the_worker(world_size):
    d, engine, _ = initialized()
    d.handle([0, 2, "analyze", [{"entry_point": "tiny/entry_point.py", "world_size": world_size}]])
    assert engine.jobs[0].request["world_size"] == world_size


def test_analyze_answers_with_the_id_before_anything_about_it():
    d, engine, sent = initialized()
    d.handle([0, 2, "analyze", [{"entry_point": "tiny/entry_point.py", "batch_size": 8}]])
    job = engine.jobs[0]
    assert job.started
    assert sent.sent[-1] == [1, 2, None, {"analysis_id": job.analysis_id}]
    assert job.request == {
        "entry_point": "tiny/entry_point.py",
        "batch_size": 8,
        "memory_capacity_bytes": None,
        "world_size": 1,
        "script_args": [],
    }
    job.listener.on_progress(job, "measuring", 0.5)
    assert sent.notifications("progress") == [{"analysis_id": 1, "phase": "measuring", "fraction": 0.5}]


def test_a_superseded_analysis_is_never_delivered():
    d, engine, sent = initialized()
    d.handle([0, 2, "analyze", [{"entry_point": "a.py"}]])
    d.handle([0, 3, "analyze", [{"entry_point": "b.py"}]])
    old, new = engine.jobs
    assert old.stopped and not new.stopped
    assert sent.notifications("analysis_error") == [
        {
            "analysis_id": old.analysis_id,
            "kind": "superseded",
            "message": "analysis 1 was superseded by analysis 2.",
            "path": None,
            "line": None,
        }
    ]
    # Messages the old worker had already written arrive late: all dropped.
    old.listener.on_progress(old, "late", 0.9)
    old.listener.on_partial(old, document())
    old.listener.on_result(old, document())
    old.listener.on_error(old, Failure("crashed", "late"))
    assert all(n["analysis_id"] == old.analysis_id for n in sent.notifications("analysis_error"))
    assert sent.notifications("analysis") == [] and sent.notifications("progress") == []
    assert d.analyses.latest is None
    new.listener.on_result(new, document())
    assert [n["analysis_id"] for n in sent.notifications("analysis")] == [new.analysis_id]
    assert d.analyses.latest.analysis_id == new.analysis_id


def test_a_client_that_answers_the_final_notification_with_predict_is_served_from_it():
    # The client may send `predict` the instant the complete analysis arrives, and the service
    # answers it on another thread: the analysis must be the latest before the notification
    # leaves (CI on a loaded machine once got the analysis before it).
    d, engine, sent = initialized()
    d.handle([0, 2, "analyze", [{"entry_point": "a.py"}]])
    first = engine.jobs[0]
    first.listener.on_result(first, document())
    d.handle([0, 3, "analyze", [{"entry_point": "b.py"}]])
    second = engine.jobs[1]
    answered_at_arrival = []

    def answer_with_predict(message):
        if message[0] == 2 and message[1] == "analysis" and message[2][0]["analysis_id"] == second.analysis_id:
            sent.on_send = None
            answered_at_arrival.append(call(d, sent, "predict", {"batch_size": 8}, msgid=9)[1]["analysis_id"])

    sent.on_send = answer_with_predict
    second.listener.on_result(second, document())
    assert answered_at_arrival == [second.analysis_id]


def test_each_analysis_ends_once():
    d, engine, sent = initialized()
    d.handle([0, 2, "analyze", [{"entry_point": "a.py"}]])
    job = engine.jobs[0]
    job.listener.on_result(job, document())
    job.listener.on_error(job, Failure("crashed", "late"))
    assert len(sent.notifications("analysis")) == 1 and sent.notifications("analysis_error") == []
    assert call(d, sent, "cancel", {"analysis_id": job.analysis_id}, msgid=5)[1] == {"cancelled": False}


def test_cancel_ends_the_current_analysis_only():
    d, engine, sent = initialized()
    d.handle([0, 2, "analyze", [{"entry_point": "a.py"}]])
    job = engine.jobs[0]
    assert call(d, sent, "cancel", {"analysis_id": 99}, msgid=3)[1] == {"cancelled": False}
    assert not job.stopped
    assert call(d, sent, "cancel", {"analysis_id": job.analysis_id}, msgid=4)[1] == {"cancelled": True}
    assert job.stopped
    assert [n["kind"] for n in sent.notifications("analysis_error")] == ["cancelled"]
    job.listener.on_result(job, document())
    assert sent.notifications("analysis") == []


def test_predict_uses_the_latest_complete_models():
    d, engine, sent = initialized()
    assert call(d, sent, "predict", {"batch_size": 8}, msgid=2)[0]["code"] == "no_models"
    d.handle([0, 3, "analyze", [{"entry_point": "a.py"}]])
    job = engine.jobs[0]
    job.listener.on_partial(job, document(models=False))
    assert call(d, sent, "predict", {"batch_size": 8}, msgid=4)[0]["code"] == "no_models"  # partial ≠ complete
    job.listener.on_result(job, document())
    error, result, _ = call(d, sent, "predict", {"batch_size": 40}, msgid=5)
    assert error is None
    assert result["run_time_ms"] == pytest.approx(0.1 * 40 + 1.0)
    assert result["samples_per_second"] == pytest.approx(40 / 5.0 * 1000)
    assert result["peak_memory_bytes"] == pytest.approx(1000 * 40 + 5000)
    assert result["fits"] is True and result["warning"] is None
    assert "below the smallest measured" in call(d, sent, "predict", {"batch_size": 2}, msgid=6)[1]["warning"]


@pytest.mark.parametrize(
    ("batch_size", "warning"),
    [
        (7, "batch size 7 is below the smallest measured (8), where the models are not reliable."),
        (8, None),  # the smallest measured: measured, no warning
        (128, None),  # the end of the trusted range: 4 × the largest measured (32)
        (
            129,
            "batch size 129 is beyond the trusted range (up to 128, 4× the largest measured): the prediction is "
            "an extrapolation.",
        ),
    ],
)
def test_predict_warns_outside_the_trusted_range_and_only_there(batch_size, warning):
    d, engine, sent = initialized()
    d.handle([0, 3, "analyze", [{"entry_point": "a.py"}]])
    job = engine.jobs[0]
    job.listener.on_result(job, document())  # measured at 8, 16 and 32
    assert call(d, sent, "predict", {"batch_size": batch_size}, msgid=4)[1]["warning"] == warning


def test_analyze_after_shutdown_on_the_same_connection_is_shutting_down():
    d, engine, sent = initialized()
    assert call(d, sent, "shutdown", msgid=2)[1] == {}
    error, result, _ = call(d, sent, "analyze", {"entry_point": "a.py"}, msgid=3)
    assert result is None
    assert error == {"code": "shutting_down", "message": "the connection is closing"}
    assert engine.jobs == []  # nothing was started


def test_predict_without_models_says_why():
    d, engine, sent = initialized()
    d.handle([0, 3, "analyze", [{"entry_point": "a.py"}]])
    job = engine.jobs[0]
    job.listener.on_result(job, document(models=False))
    error = call(d, sent, "predict", {"batch_size": 8}, msgid=4)[0]
    assert error["code"] == "no_models" and "Only one batch size" in error["message"]
    assert "slower while recorded" not in error["message"]  # the reason, not every warning


def test_client_root_maps_documents_errors_and_entry_points():
    d, engine, sent = initialized(client_root="/home/me/mnt/project")
    d.handle([0, 3, "analyze", [{"entry_point": "/home/me/mnt/project/tiny/entry_point.py"}]])
    job = engine.jobs[0]
    assert job.request["entry_point"] == "tiny/entry_point.py"
    job.listener.on_result(job, document())
    assert sent.notifications("analysis")[0]["document"]["project_root"] == "/home/me/mnt/project"
    assert d.analyses.latest.document["project_root"] == "/srv/project"  # kept as the engine wrote it


def test_notifications_from_the_client_are_acted_on_without_responses():
    d, engine, sent = initialized()
    d.handle([0, 2, "analyze", [{"entry_point": "a.py"}]])
    before = len(sent.responses())
    assert d.handle([2, "cancel", [{"analysis_id": engine.jobs[0].analysis_id}]])
    assert engine.jobs[0].stopped and len(sent.responses()) == before
    assert d.handle([2, "nonsense", []])
    assert sent.notifications("protocol_error")[-1]["code"] == "method_not_found"


def test_shutdown_answers_then_stops_the_engine():
    d, engine, sent = initialized()
    error, result, keep = call(d, sent, "shutdown", msgid=9)
    assert (error, result, keep) == (None, {}, False)
    assert engine.shutdown_requested


def test_shutdown_ends_the_running_analysis_before_answering():
    d, engine, sent = initialized()
    d.handle([0, 2, "analyze", [{"entry_point": "a.py"}]])
    d.handle([0, 3, "shutdown", []])
    job = engine.jobs[0]
    assert job.stopped
    ended = [m for m in sent.sent if (m[0] == 1 and m[1] == 3) or (m[0] == 2 and m[1] == "analysis_error")]
    assert [m[0] for m in ended] == [2, 1]  # the final notification, then the answer
    assert ended[0][2][0]["kind"] == "cancelled"
    job.listener.on_error(job, Failure("crashed", "killed"))  # what its worker's death would say
    assert len(sent.notifications("analysis_error")) == 1


def test_closing_the_connection_stops_its_analysis_silently():
    d, engine, sent = initialized()
    d.handle([0, 2, "analyze", [{"entry_point": "a.py"}]])
    count = len(sent.sent)
    d.close()
    assert engine.jobs[0].stopped
    engine.jobs[0].listener.on_result(engine.jobs[0], document())
    assert len(sent.sent) == count


# --- paths, tokens, arguments ---------------------------------------------------------------


def test_path_mapping_replaces_the_root_as_a_whole_component():
    mapper = PathMapper("/srv/proj", "/Users/me/proj/")
    mapped = mapper.to_client({"a": "/srv/proj", "b": ["/srv/proj/x.py: no", "/srv/project/y.py"], "c": 3})
    assert mapped == {"a": "/Users/me/proj", "b": ["/Users/me/proj/x.py: no", "/srv/project/y.py"], "c": 3}
    assert PathMapper("/srv/proj", None).to_client({"a": "/srv/proj"}) == {"a": "/srv/proj"}
    # A root that ends a sentence is the root; a sibling folder whose name goes on after a dot is not.
    said = "the entry point must lie under /srv/proj. Move it into /srv/proj.old or /srv/proj.\nNext"
    assert mapper.to_client(said) == (
        "the entry point must lie under /Users/me/proj. Move it into /srv/proj.old or /Users/me/proj.\nNext"
    )
    assert mapper.entry_to_server("/Users/me/proj/a/b.py") == "a/b.py"
    assert mapper.entry_to_server("a/b.py") == "a/b.py"


def test_the_token_file_is_private_and_replaced_atomically(tmp_path):
    path = tmp_path / "state" / "skyline" / "token"
    write_token_file(path, "first")
    write_token_file(path, "second")
    assert path.read_text() == "second\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert [p.name for p in path.parent.iterdir()] == ["token"]


def test_a_token_is_256_random_bits_in_url_safe_text():
    tokens = {new_token() for _ in range(50)}
    assert len(tokens) == 50
    for token in tokens:
        # 32 bytes in unpadded base64url: 43 characters of A-Z a-z 0-9 - _
        assert len(token) == 43 and all(c.isascii() and (c.isalnum() or c in "-_") for c in token), token


def test_the_default_token_path_follows_xdg_state_home(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    assert default_token_path() == tmp_path / "state" / "skyline" / "token"
    for unset in (lambda: monkeypatch.delenv("XDG_STATE_HOME"), lambda: monkeypatch.setenv("XDG_STATE_HOME", "")):
        unset()
        monkeypatch.setenv("HOME", str(tmp_path / "home"))
        assert default_token_path() == tmp_path / "home" / ".local" / "state" / "skyline" / "token"


def test_the_token_file_is_removed_only_while_it_holds_our_token(tmp_path):
    path = tmp_path / "token"
    write_token_file(path, "ours")
    remove_token_file(path, "theirs")  # a newer service replaced it: theirs now
    assert path.read_text() == "ours\n"
    remove_token_file(path, "ours")
    assert not path.exists()
    remove_token_file(path, "ours")  # already gone: nothing to do, nothing raised
    remove_token_file(None, "ours")  # no file was written (stdio)


def test_tokens_compare_exactly():
    assert token_matches("abc", "abc")
    assert not token_matches("abc", "abd") and not token_matches("abc", "ab") and not token_matches("abc", None)
    assert not token_matches("abc", "\udcff")  # a lone surrogate from a bad client


@pytest.mark.parametrize(
    "text, expected",
    [
        ("8080", ("127.0.0.1", 8080)),
        (":0", ("127.0.0.1", 0)),
        ("0.0.0.0:1", ("0.0.0.0", 1)),
        ("localhost:22", ("localhost", 22)),
        ("[::1]:9", ("::1", 9)),
    ],
)
def test_listen_addresses(text, expected):
    assert parse_listen(text) == expected


@pytest.mark.parametrize("text", ["", "host", "host:", "1:2:3", "70000", "[::1]"])
def test_bad_listen_addresses(text):
    with pytest.raises(argparse.ArgumentTypeError):
        parse_listen(text)


def test_loopback_detection():
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.5")


@pytest.mark.parametrize(
    "text, size", [("1024", 1024), ("2G", 2 << 30), ("512M", 512 << 20), ("1.5GiB", 3 << 29), ("4k", 4096)]
)
def test_sizes(text, size):
    assert parse_size(text) == size


# --- failures -------------------------------------------------------------------------------

DUMP = """\
some output of the user's
Thread 0x00007f0000000001 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 320 in wait
  File "/srv/proj/helper.py", line 5 in background

Current thread 0x00007f0000000002 (most recent call first):
  File "/srv/proj/.venv/lib/python3.11/site-packages/torch/nn/modules/module.py", line 1000 in _call_impl
  File "/srv/proj/model.py", line 12 in forward
  File "/srv/proj/entry_point.py", line 30 in iteration
  File "/opt/skyline_engine/measure/iteration.py", line 120 in _call_iteration
"""


def test_the_users_innermost_frame_is_read_from_the_current_threads_stack():
    assert user_frame_in_faulthandler_dump(DUMP.splitlines(), "/srv/proj") == ("model.py", 12)


def test_only_the_last_dump_counts():
    older = DUMP.replace("line 12", "line 99")
    lines = (older + "later output\n" + DUMP).splitlines()
    assert user_frame_in_faulthandler_dump(lines, "/srv/proj") == ("model.py", 12)
    assert user_frame_in_faulthandler_dump(["nothing here"], "/srv/proj") == (None, None)


def test_deaths_say_which():
    segv = failures.death_error(-11, oom_killed=False, last_phase="building the model")
    assert (segv.kind, segv.signal) == ("crashed", "SIGSEGV")
    assert "segmentation fault" in segv.message and "building the model" in segv.message
    assert failures.death_error(-9, oom_killed=True, last_phase=None).kind == "out_of_memory"
    killed = failures.death_error(-9, oom_killed=False, last_phase=None)
    assert killed.kind == "crashed" and "SIGKILL" in killed.message
    exited = failures.death_error(3, oom_killed=False, last_phase=None)
    assert exited.exit_status == 3 and "status 3" in exited.message


# --- TCP admission ----------------------------------------------------------------------------


def test_the_oldest_unauthenticated_connection_makes_room():
    admission = Admission(max_clients=2, max_pending=3, max_pending_per_peer=2)
    a, b, c = Seat(None, "10.0.0.1"), Seat(None, "10.0.0.2"), Seat(None, "10.0.0.3")
    assert [admission.arrive(seat) for seat in (a, b, c)] == [None, None, None]
    d = Seat(None, "10.0.0.4")
    assert admission.arrive(d) is a and "initialize" in a.evicted  # the budget in all
    e = Seat(None, "10.0.0.4")
    assert admission.arrive(e) is b
    f = Seat(None, "10.0.0.4")
    assert admission.arrive(f) is d and "10.0.0.4" in d.evicted  # that address's own budget
    with pytest.raises(RpcError) as caught:
        admission.authenticate(a)
    assert caught.value.code == "too_many_connections" and caught.value.close


def test_authenticated_connections_are_never_closed_for_room():
    admission = Admission(max_clients=1, max_pending=1, max_pending_per_peer=1)
    user, other = Seat(None, "::1"), Seat(None, "::1")
    admission.arrive(user)
    admission.authenticate(user)
    assert admission.arrive(other) is None  # the user's seat no longer counts as pending
    assert admission.arrive(Seat(None, "::1")) is other and user.evicted is None
    late = Seat(None, "::2")
    admission.arrive(late)
    with pytest.raises(RpcError) as caught:
        admission.authenticate(late)
    assert "1 clients are connected already" in caught.value.message
    admission.leave(user)
    admission.arrive(spare := Seat(None, "::3"))
    admission.authenticate(spare)


def test_before_initialize_frames_are_limited_to_the_pending_size():
    def run(frames):
        d, _, _ = dispatcher(token="secret")
        out = bytearray()
        connection = Connection(out.extend)
        d._send = connection.send
        chunks = iter([*frames, b""])
        serve_client(lambda: next(chunks), connection, d, 1 << 20)
        return list(msgpack.Unpacker(io.BytesIO(bytes(out)), raw=False))

    big = msgpack.packb([0, 2, "status", [{"padding": "x" * PENDING_MAX_FRAME_BYTES}]])
    assert run([big]) == [[2, "protocol_error", [{"code": "frame_too_large", "message": ANY}]]]
    initialize = msgpack.packb([0, 1, "initialize", [{"protocol_version": 1, "token": "secret"}]])
    answers = run([initialize, big])
    assert [(m[1], m[2]) for m in answers] == [(1, None), (2, None)]


def test_the_largest_initialize_fits_before_authentication():
    # The pending limit is small to keep skimming unauthenticated frames cheap; the largest
    # `initialize` the protocol allows (a 4,096-byte client root of 2-byte characters counts as
    # 4,096 bytes, a 64-character token) must still get through.
    params = {"protocol_version": 1, "token": "t" * 64, "client_root": "/" + "é" * 2047 + "r"}
    assert len(params["client_root"].encode()) == 4096
    frame = msgpack.packb([0, (1 << 32) - 1, "initialize", [params]])
    assert len(frame) < PENDING_MAX_FRAME_BYTES


# --- messages from workers ------------------------------------------------------------------


@pytest.mark.parametrize(
    "message",
    [
        {"type": "ready", "pid": 5, "device": DEVICE, "error": None},
        {"type": "ready", "pid": 5, "device": None, "error": {"kind": "worker_start", "message": "no torch"}},
        {"type": "started", "pid": 5},
        {"type": "progress", "phase": "measuring", "fraction": 0.5},
        {"type": "progress", "phase": "done", "fraction": 1},
        {"type": "partial", "document": document(models=False)},
        {"type": "result", "document": document()},
        {"type": "result", "document": document(models=False)},
        {"type": "error", "kind": "user_code", "message": "model.py:3: boom", "path": "model.py", "line": 3},
    ],
)
def test_well_formed_worker_messages_pass(message):
    assert check_message(message) is message


@pytest.mark.parametrize(
    "message",
    [
        [1, 2],
        {"type": 3},
        {"type": "surprise"},
        {"type": "ready", "pid": "5", "device": None, "error": None},
        {"type": "ready", "pid": 5, "device": [], "error": None},
        {"type": "progress", "phase": 5, "fraction": 0.5},
        {"type": "progress", "phase": "x" * 10_000, "fraction": 0.5},
        {"type": "progress", "phase": "x", "fraction": float("nan")},
        {"type": "progress", "phase": "x", "fraction": True},
        {"type": "partial", "document": "a document"},
        {"type": "partial", "document": {"a": nested(40)}},
        {"type": "result", "document": [1]},
        {"type": "result", "document": {**document(), "models": {"run_time_ms": {}}}},
        {"type": "result", "document": {**document(), "device": {"memory_capacity_bytes": "big"}}},
        {"type": "result", "document": {**document(), "warnings": [3]}},
        {"type": "error", "kind": "cancelled", "message": "x"},
        {"type": "error", "kind": "user_code", "message": None},
        {"type": "error", "kind": "user_code", "message": "x", "line": "3"},
        {"type": "error", "kind": "user_code", "message": "x", "details": [1]},
    ],
)
def test_malformed_worker_messages_are_refused_with_a_reason(message):
    with pytest.raises(WorkerProtocolError) as caught:
        check_message(message)
    assert 0 < len(str(caught.value)) < 200
