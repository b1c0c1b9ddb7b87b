"""The fuzz and the dispatcher's contract against the real service, not the in-process fake engine:
`skyline serve --listen` in a subprocess, its real workers running real analyses.

- Random and mutated streams, each on a connection of its own that the client then ends: whatever
  they start (a mutated stream may still hold an `analyze`), the service writes back only
  well-formed messages, closes the connection, stays up, and afterwards still runs an analysis to
  its end with no worker left over.
- Random sequences of requests on one connection (analyses that finish in seconds and ones that
  surely run on, cancels, predicts, status), checked against docs/protocol.md: one response per
  request; one final notification per analysis and nothing of it after; a superseded analysis
  ends before its successor says anything; `cancel` says true exactly when it ended the analysis;
  `predict` answers from a complete analysis never older than the newest the client has seen.

Fewer examples than the in-process fuzz: each may start and kill real workers.
"""

from __future__ import annotations

import io
import re
import socket
from pathlib import Path

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fuzz_frames import assert_well_formed, chunked, message_like, mutated_stream, valid_frames
from nvim_helpers import wait_for
from service_client import WAIT_S, ServiceProcess, children_of, copy_project, is_final, zombie_children

pytestmark = pytest.mark.timeout(900)

MAX_FRAME = 2048
TINY = "tiny/entry_point.py"  # seconds to analyse
SLOW = "slow/entry_point.py"  # its model provider sleeps for minutes: surely still running
REAL = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    root = copy_project(tmp_path_factory.mktemp("real-fuzz"))
    service = ServiceProcess(
        root, "--quick", "--max-frame-bytes", str(MAX_FRAME), stdio=False, token_file=root.parent / "token"
    )
    yield service
    service.stop()


def exchange(service: ServiceProcess, data: bytes, sizes: list[int], initialized: bool) -> list:
    """Send `data` on a new connection (after a right `initialize` when `initialized`), end the
    client's side, and read what the service writes until it closes the connection."""
    received = bytearray()
    with socket.create_connection((service.host, service.port), timeout=WAIT_S) as sock:
        try:
            if initialized:
                sock.sendall(msgpack.packb([0, 0, "initialize", [{"protocol_version": 1, "token": service.token}]]))
            for chunk in chunked(data, sizes):
                sock.sendall(chunk)
            sock.shutdown(socket.SHUT_WR)
        except OSError:  # EPIPE, ECONNRESET, ENOTCONN
            pass  # the service closed first (a wrong token, a fatal frame); what it wrote is read below
        while True:
            try:
                part = sock.recv(65536)
            except ConnectionResetError:
                break
            except TimeoutError:
                raise AssertionError("the service kept the connection open after the client's end") from None
            if not part:
                break
            received += part
    return list(msgpack.Unpacker(io.BytesIO(bytes(received)), raw=False, strict_map_key=False))


def assert_still_serves(service: ServiceProcess) -> None:
    """A new client runs an analysis to its end; then only the warm spare worker is left."""
    assert service.alive(), service.log()
    client = service.tcp_client()
    try:
        client.initialize(token=service.token)
        _, method, final = client.analyze(TINY, batch_size=8)
        assert method == "analysis", final
        assert client.request("predict", {"batch_size": 8})["batch_size"] == 8
    finally:
        client.close()
    pid = service.proc.pid
    # Waited for: a worker that has just ended is reaped by the service's thread a moment later.
    try:
        wait_for(lambda: len(children_of(pid)) <= 1 and not zombie_children(pid), "the workers to be reaped", WAIT_S)
    except AssertionError:
        left = {child: Path(f"/proc/{child}/cmdline").read_bytes().replace(b"\0", b" ") for child in children_of(pid)}
        raise AssertionError(f"workers left: {left}, zombies {zombie_children(pid)}\n{service.log()[-4000:]}") from None


def test_random_bytes_leave_the_real_service_serving(service):
    @REAL
    @given(st.binary(max_size=4096), st.lists(st.integers(1, 512), max_size=20), st.booleans())
    def one(data, sizes, initialized):
        assert_well_formed(exchange(service, data, sizes, initialized))
        assert service.alive(), service.log()

    one()
    assert_still_serves(service)


def test_mutated_frames_leave_the_real_service_serving(service):
    # No `shutdown` among the frames: it would stop the service every example shares.
    frames = valid_frames(service.token, shutdown=False)

    @REAL
    @given(mutated_stream(frames), st.lists(st.integers(1, 64), max_size=20), st.booleans())
    def one(data, sizes, initialized):
        assert_well_formed(exchange(service, data, sizes, initialized))
        assert service.alive(), service.log()

    one()
    assert_still_serves(service)


def is_shutdown(obj) -> bool:
    return isinstance(obj, list) and len(obj) >= 3 and obj[0] in (0, 2) and "shutdown" in obj[1:3]


def test_decoded_objects_get_at_most_one_response_each_from_the_real_service(service):
    @REAL
    @given(st.lists(message_like.filter(lambda obj: not is_shutdown(obj)), min_size=1, max_size=8))
    def one(objects):
        data = b"".join(msgpack.packb(obj) for obj in objects)
        messages = exchange(service, data, [len(data)], initialized=True)
        assert_well_formed(messages)
        ids = [m[1] for m in messages if m[0] == 1]
        assert ids[:1] == [0], messages  # the initialize
        requests = [o[1] for o in objects if isinstance(o, list) and len(o) >= 2 and o[0] == 0 and type(o[0]) is int]
        for msgid in set(ids[1:]):
            assert ids[1:].count(msgid) <= requests.count(msgid), (msgid, messages)
        assert service.alive(), service.log()

    one()
    assert_still_serves(service)


# --- the contract, on random sequences of requests ------------------------------------------

requests = st.lists(
    st.one_of(
        st.tuples(st.just("analyze"), st.sampled_from([TINY, SLOW]), st.sampled_from([4, 8])),
        st.tuples(st.just("cancel"), st.sampled_from(["current", "earlier", "unknown"])),
        st.tuples(st.just("predict"), st.integers(1, 64)),
        st.just(("status",)),
        st.just(("wait",)),  # for the current analysis's final notification, unless it is a slow one
    ),
    min_size=1,
    max_size=6,
)


class Session:
    """One connection's requests and what the service said, checked as they go."""

    def __init__(self, client) -> None:
        self.client = client
        self.ids: list[int] = []  # announced analyses, oldest first
        self.slow: set[int] = set()  # the ones that surely run on until ended
        self.cancelled: dict[int, bool] = {}

    def finals_so_far(self) -> dict[int, tuple[int, str, dict]]:
        finals = {}
        for index, (method, params) in enumerate(list(self.client.notifications)):
            if is_final(method, params) and params["analysis_id"] not in finals:
                finals[params["analysis_id"]] = (index, method, params)
        return finals

    def newest_complete_seen(self) -> int | None:
        complete = [i for i, (_, m, p) in self.finals_so_far().items() if m == "analysis"]
        return max(complete, default=None)

    def analyze(self, entry_point: str, batch_size: int) -> None:
        answer = self.client.request("analyze", {"entry_point": entry_point, "batch_size": batch_size})
        self.ids.append(answer["analysis_id"])
        if entry_point == SLOW:
            self.slow.add(answer["analysis_id"])

    def cancel(self, which: str) -> None:
        target = {"current": self.ids[-1:], "earlier": self.ids[-2:-1]}.get(which) or [10**9]
        cancelled = self.client.request("cancel", {"analysis_id": target[0]})["cancelled"]
        if which != "current":  # an analysis already ended, or none
            assert not cancelled, (which, target)
        self.cancelled[target[0]] = self.cancelled.get(target[0], False) or cancelled

    def predict(self, batch_size: int) -> None:
        seen = self.newest_complete_seen()
        error, result = self.client.call("predict", {"batch_size": batch_size})
        if error is not None:
            assert error["code"] == "no_models", error
            named = re.search(r"analysis (\d+)", error["message"])
            assert seen is None or (named and int(named.group(1)) >= seen), (error, seen)
        else:
            assert result["analysis_id"] in self.ids and (seen is None or result["analysis_id"] >= seen), (result, seen)

    def status(self) -> None:
        running = self.client.request("status")["analysis_id"]
        assert running is None or running in self.ids

    def wait(self) -> None:
        if self.ids and self.ids[-1] not in self.slow:
            self.client.wait_final(self.ids[-1])

    def end(self) -> None:
        """Let the last analysis end (cancelled if still running), then check every analysis."""
        if self.ids:
            self.client.request("cancel", {"analysis_id": self.ids[-1]})
            self.client.wait_final(self.ids[-1])
        finals = self.finals_so_far()
        notifications = list(self.client.notifications)
        for position, analysis_id in enumerate(self.ids):
            assert analysis_id in finals, (analysis_id, notifications)
            index, _, params = finals[analysis_id]
            about = [i for i, (_, p) in enumerate(notifications) if p.get("analysis_id") == analysis_id]
            assert about[-1] == index, f"analysis {analysis_id} said more after its end: {notifications}"
            kind = params.get("kind")
            assert (kind == "cancelled") == self.cancelled.get(analysis_id, False) or position == len(self.ids) - 1
            if kind == "superseded":
                successor = self.ids[position + 1]
                assert f"superseded by analysis {successor}" in params["message"]
                later = [i for i, (_, p) in enumerate(notifications) if p.get("analysis_id") == successor]
                assert not later or index < later[0], notifications


def test_random_request_sequences_keep_the_protocols_promises(service):
    @settings(REAL, max_examples=12)
    @given(requests)
    def one(steps):
        client = service.tcp_client()
        try:
            client.initialize(token=service.token)
            session = Session(client)
            for name, *args in steps:
                getattr(session, name)(*args)
            session.end()
        finally:
            client.close()
        assert service.alive(), service.log()

    one()
    assert_still_serves(service)
