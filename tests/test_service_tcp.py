"""The engine service over loopback TCP, as a remote machine would run it: the real
`skyline serve --listen 127.0.0.1:0` in a subprocess, several real msgpack-RPC clients at once.

Covers the token (refusal, its file), client_root mapping, bad input from one client leaving the
others unaffected, silent clients, and a client that disconnects mid-analysis.
"""

from __future__ import annotations

import socket
import stat
import subprocess
import sys
import time

import msgpack
import pytest

from service_client import (
    ServiceProcess,
    children_of,
    copy_project,
    deeply_nested,
    process_gone,
    request_with_deep_params,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]  # the service

TINY = "tiny/entry_point.py"
SLOW = "slow/entry_point.py"
MAX_FRAME = 4096
HANDSHAKE_S = 3


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return copy_project(tmp_path_factory.mktemp("tcp"))


@pytest.fixture(scope="module")
def token_file(tmp_path_factory):
    return tmp_path_factory.mktemp("state") / "skyline" / "token"


@pytest.fixture(scope="module")
def service(root, token_file):
    service = ServiceProcess(
        root,
        "--quick",
        "--max-frame-bytes",
        str(MAX_FRAME),
        "--handshake-timeout",
        str(HANDSHAKE_S),
        stdio=False,
        token_file=token_file,
    )
    yield service
    service.stop()


@pytest.fixture
def connect(service):
    clients = []

    def connect():
        assert service.alive(), service.log()
        client = service.tcp_client()
        clients.append(client)
        return client

    yield connect
    for client in clients:
        client.close()
    assert service.alive(), service.log()


def assert_service_still_serves(connect, service):
    client = connect()
    assert client.initialize(token=service.token)["protocol_version"] == 1
    assert client.request("status")["analysis_id"] is None


# --- the token ----------------------------------------------------------------------------


def test_the_token_file_is_for_the_user_alone(service, token_file):
    assert token_file.read_text().strip() == service.token
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    assert stat.S_IMODE(token_file.parent.stat().st_mode) == 0o700
    assert len(service.token) >= 32


@pytest.mark.parametrize("token", [None, "wrong", "", 12345])
def test_a_missing_or_wrong_token_closes_the_connection(connect, service, token):
    client = connect()
    params = {"protocol_version": 1}
    if token is not None:
        params["token"] = token
    error, _ = client.call("initialize", params)
    assert error["code"] == "unauthorized"
    assert client.wait_closed(30)
    assert_service_still_serves(connect, service)


def test_a_token_for_a_prefix_is_refused(connect, service):
    client = connect()
    error, _ = client.call("initialize", {"protocol_version": 1, "token": service.token[:-1]})
    assert error["code"] == "unauthorized"
    assert client.wait_closed(30)


# --- a whole session ------------------------------------------------------------------------


def test_analyze_and_predict_over_tcp_with_client_root(connect, service, root):
    client = connect()
    info = client.initialize(token=service.token, client_root="/Users/me/mnt/project")
    assert info["server_root"] == str(root.resolve())
    error, _ = client.call("predict", {"batch_size": 8})
    assert error["code"] == "no_models"
    # An editor may send the buffer's absolute name, under its own root.
    analysis_id, method, final = client.analyze("/Users/me/mnt/project/" + TINY)
    assert method == "analysis", final
    partial = next(p for m, p in client.about(analysis_id) if m == "analysis" and p["partial"])
    for document in (partial["document"], final["document"]):
        assert document["project_root"] == "/Users/me/mnt/project"
        assert document["entry_point"] == TINY
        assert str(root.resolve()) not in repr(document)
    prediction = client.request("predict", {"batch_size": 32})
    assert prediction["analysis_id"] == analysis_id
    assert set(prediction) >= {"run_time_ms", "samples_per_second", "peak_memory_bytes", "fits"}


def test_errors_name_paths_under_the_client_root(connect, service):
    client = connect()
    client.initialize(token=service.token, client_root="/Users/me/mnt/project")
    _, method, error = client.analyze("missing/entry_point.py")
    assert method == "analysis_error"
    assert "/Users/me/mnt/project/missing/entry_point.py" in error["message"]


def test_cancel_and_supersession_over_tcp(connect, service):
    client = connect()
    client.initialize(token=service.token)
    first = client.request("analyze", {"entry_point": SLOW})["analysis_id"]
    client.wait_notification(lambda m, p: p.get("analysis_id") == first and p.get("phase") == "building the model")
    assert client.request("cancel", {"analysis_id": first}) == {"cancelled": True}
    assert client.wait_final(first)[1]["kind"] == "cancelled"
    second = client.request("analyze", {"entry_point": SLOW})["analysis_id"]
    client.wait_notification(lambda m, p: p.get("analysis_id") == second and m == "progress")
    third, method, final = client.analyze(TINY)
    assert method == "analysis", final
    assert [(m, p["kind"]) for m, p in client.about(second) if m != "progress"] == [("analysis_error", "superseded")]
    assert client.request("predict", {"batch_size": 8})["analysis_id"] == third


def one_measuring_one_waiting(connect, service):
    """Two clients: the first's slow analysis measuring, the second's waiting for the device.
    (first, its analysis id, second, its analysis id, the second's first progress)."""
    first, second = connect(), connect()
    for client in (first, second):
        client.initialize(token=service.token)
    running = first.request("analyze", {"entry_point": SLOW})["analysis_id"]
    first.wait_notification(lambda m, p: p.get("analysis_id") == running and p.get("phase") == "building the model")
    waiting = second.request("analyze", {"entry_point": TINY})["analysis_id"]
    _, said = second.wait_notification(lambda m, p: p.get("analysis_id") == waiting and m == "progress")
    return first, running, second, waiting, said


def test_one_analysis_at_a_time_measures_on_the_device(connect, service):
    # Side by side, two analyses skew each other's times (and on a GPU, its memory): the second
    # client's waits, saying so, until the first one's worker is gone.
    first, running, second, waiting, said = one_measuring_one_waiting(connect, service)
    first_worker = first.request("status")["worker_pid"]
    assert said["phase"] == "waiting for the device: another analysis is measuring on it"
    assert first.request("cancel", {"analysis_id": running}) == {"cancelled": True}
    method, final = second.wait_final(waiting)
    assert method == "analysis", final
    assert process_gone(first_worker)


def test_an_analysis_waiting_for_the_device_has_no_worker_and_is_cancelled_cleanly(connect, service):
    # Each waiting analysis had started its worker at once (torch imported: 300 MB each, six
    # clients 1.8 GB), and one cancelled while it waited left a zombie until the service ended.
    # Now a worker starts once the analysis holds the device.
    first, running, second, waiting, _ = one_measuring_one_waiting(connect, service)
    assert second.request("status")["worker_pid"] is None
    children_before = set(children_of(service.proc.pid))  # the service's: the running worker
    assert second.request("cancel", {"analysis_id": waiting}) == {"cancelled": True}
    assert second.wait_final(waiting)[1]["kind"] == "cancelled"
    assert set(children_of(service.proc.pid)) <= children_before  # none started for it, none left
    assert first.request("cancel", {"analysis_id": running}) == {"cancelled": True}
    assert first.wait_final(running)[1]["kind"] == "cancelled"


def test_two_clients_analyze_independently(connect, service):
    first, second = connect(), connect()
    for client in (first, second):
        client.initialize(token=service.token)
    a = first.request("analyze", {"entry_point": TINY})["analysis_id"]
    b = second.request("analyze", {"entry_point": TINY})["analysis_id"]
    assert a != b
    assert first.wait_final(a)[0] == "analysis"
    assert second.wait_final(b)[0] == "analysis"
    # Each sees only its own analyses.
    assert all(p.get("analysis_id") == a for _, p in first.notifications)
    assert all(p.get("analysis_id") == b for _, p in second.notifications)


def test_a_client_that_disconnects_mid_analysis_takes_its_worker_with_it(connect, service):
    client = connect()
    client.initialize(token=service.token)
    analysis_id = client.request("analyze", {"entry_point": SLOW})["analysis_id"]
    client.wait_notification(
        lambda m, p: p.get("analysis_id") == analysis_id and p.get("phase") == "building the model"
    )
    worker = client.request("status")["worker_pid"]
    client.close()
    assert process_gone(worker)
    # New clients are still accepted and served.
    other = connect()
    other.initialize(token=service.token)
    _, method, final = other.analyze(TINY)
    assert method == "analysis", final


# --- bad input ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "garbage, code",
    [
        (b"\xc1", "parse_error"),  # a byte msgpack never uses
        (b"\xa2\xff\xfe", "parse_error"),  # a string that is not UTF-8
        (msgpack.packb("x" * (2 * MAX_FRAME)), "frame_too_large"),
        # Announces a 4 GiB string: refused once the part received passes the limit.
        (b"\xdb\xff\xff\xff\xff" + b"x" * MAX_FRAME, "frame_too_large"),
    ],
)
def test_a_broken_stream_gets_an_error_and_a_closed_connection(connect, service, garbage, code):
    bystander = connect()
    bystander.initialize(token=service.token)
    client = connect()
    client.send_raw(garbage)
    assert client.wait_closed(30)
    assert [(m, p["code"]) for m, p in client.notifications] == [("protocol_error", code)]
    assert bystander.request("status")["analysis_id"] is None  # unaffected


# 4000: deeper than msgpack's own limit, within this service's 4 KiB frames.
@pytest.mark.parametrize("depth", [1000, 4000])
def test_a_frame_nested_too_deep_gets_an_error_before_authentication_and_the_connection_lives(connect, service, depth):
    client = connect()
    client.send_raw(deeply_nested(depth))
    client.send_raw(request_with_deep_params(7, depth))
    error, _ = client.wait_response(7)
    assert error["code"] == "invalid_message" and "32 deep" in error["message"]
    assert [(m, p["code"]) for m, p in client.notifications] == [("protocol_error", "invalid_message")]
    assert client.initialize(token=service.token)["protocol_version"] == 1
    assert client.request("status")["analysis_id"] is None


def test_a_truncated_frame_then_disconnect_leaves_the_service_up(connect, service):
    client = connect()
    frame = msgpack.packb([0, 1, "initialize", [{"protocol_version": 1, "token": service.token}]])
    client.send_raw(frame[: len(frame) // 2])
    client.close()
    assert_service_still_serves(connect, service)


def test_a_frame_split_across_writes_is_assembled(connect, service):
    client = connect()
    frame = msgpack.packb([0, 1, "initialize", [{"protocol_version": 1, "token": service.token}]])
    for byte in frame:
        client.send_raw(bytes([byte]))
    error, result = client.wait_response(1)
    assert error is None and result["protocol_version"] == 1


def test_well_formed_but_invalid_messages_get_errors_and_the_connection_lives(connect, service):
    client = connect()
    error, _ = client.call("analyze", {"entry_point": TINY})
    assert error["code"] == "not_initialized"
    client.initialize(token=service.token)
    error, _ = client.call("initialize", {"protocol_version": 1, "token": service.token})
    assert error["code"] == "already_initialized"
    error, _ = client.call("no_such_method")
    assert error["code"] == "method_not_found"
    client.send([0, 77, "status"])  # three elements: the msgid is known, so a response says why
    assert client.wait_response(77)[0]["code"] == "invalid_message"
    client.send([1, 5, None, "a response from a client"])
    client.send({"not": "a message"})
    client.send(42)
    client.wait_notification(lambda m, p: len(client.notifications) >= 3)
    assert {p["code"] for m, p in client.notifications} == {"invalid_message"}
    assert client.request("status")["analysis_id"] is None


def test_an_unsupported_protocol_version_is_refused(connect, service):
    client = connect()
    error, _ = client.call("initialize", {"protocol_version": 99, "token": service.token})
    assert error["code"] == "unsupported_protocol_version"
    assert client.initialize(token=service.token)["protocol_version"] == 1


def test_a_silent_client_is_dropped_and_blocks_no_one(connect, service):
    silent = connect()
    time.sleep(0.2)
    # Meanwhile another client connects and is served at once.
    assert_service_still_serves(connect, service)
    assert silent.wait_closed(HANDSHAKE_S + 30)
    assert [p["code"] for m, p in silent.notifications] == ["handshake_timeout"]


def test_a_client_that_never_reads_does_not_stop_the_others(connect, service):
    # A raw socket that floods requests and reads none of the answers: once the socket buffers
    # are full, the service's writes to it block (and it stops reading it), which must hold up
    # no one else.
    greedy = socket.create_connection((service.host, service.port))
    greedy.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    greedy.sendall(msgpack.packb([0, 0, "initialize", [{"protocol_version": 1, "token": service.token}]]))
    burst = b"".join(msgpack.packb([0, i, "status", []]) for i in range(1, 10_000))
    greedy.settimeout(2.0)
    try:
        for _ in range(1000):
            try:
                greedy.sendall(burst)
            except socket.timeout:
                break  # the service no longer reads from it: its answers are stuck
        else:
            pytest.fail("the service kept reading a client that reads nothing")
        assert_service_still_serves(connect, service)
    finally:
        greedy.close()


# --- starting the TCP service ---------------------------------------------------------------


def _serve(root, *args, timeout=60):
    return subprocess.run(
        [sys.executable, "-m", "skyline_engine", "serve", "--project-root", str(root), *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_a_non_loopback_address_needs_an_explicit_flag(root, tmp_path):
    result = _serve(root, "--listen", "0.0.0.0:0", "--token-file", str(tmp_path / "token"))
    assert result.returncode == 1
    assert "not a loopback address" in result.stderr and "--allow-remote" in result.stderr
    assert not (tmp_path / "token").exists()


def test_with_the_flag_it_listens_and_warns(root, tmp_path):
    service = ServiceProcess(root, "--allow-remote", stdio=False, listen="0.0.0.0:0", token_file=tmp_path / "token")
    try:
        assert service.port > 0 and service.token
        deadline = time.monotonic() + 30
        while "WARNING" not in service.log() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert "reachable from other machines" in service.log()
    finally:
        service.stop()
    assert not (tmp_path / "token").exists()  # removed at exit


def test_bad_listen_addresses_are_usage_errors(root):
    result = _serve(root, "--listen", "localhost:99999")
    assert result.returncode == 2
    assert "between 0 and 65535" in result.stderr


def test_a_worker_memory_limit_with_cuda_is_refused_at_start(root):
    result = _serve(root, "--stdio", "--device", "cuda", "--worker-memory-limit", "8G")
    assert result.returncode == 1
    assert result.stderr.startswith(
        "skyline: error: --worker-memory-limit caps each worker's address space, and CUDA cannot start under such "
        "a cap. Give --device cpu"
    )


def test_shutdown_stops_the_tcp_service_and_removes_its_token(root, tmp_path):
    token_file = tmp_path / "token"
    service = ServiceProcess(root, "--quick", stdio=False, token_file=token_file)
    try:
        client, bystander = service.tcp_client(), service.tcp_client()
        client.initialize(token=service.token)
        bystander.initialize(token=service.token)
        # The bystander's analysis runs when another client stops the service.
        analysis_id = bystander.request("analyze", {"entry_point": SLOW})["analysis_id"]
        bystander.wait_notification(
            lambda m, p: p.get("analysis_id") == analysis_id and p.get("phase") == "building the model"
        )
        worker = bystander.request("status")["worker_pid"]
        assert client.request("shutdown") == {}
        assert service.proc.wait(60) == 0
        assert bystander.wait_closed(30)
        finals = [(m, p["kind"]) for m, p in bystander.about(analysis_id) if m != "progress"]
        assert finals == [("analysis_error", "cancelled")]
        assert process_gone(worker)
        assert not token_file.exists()
    finally:
        service.stop()
