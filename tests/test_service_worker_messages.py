"""A worker's messages are untrusted input: any code running in the worker can write to its message
channel. Each malformed message ends its analysis with `analysis_error` kind `worker_protocol`,
leaves no zombie behind, and leaves the client's latest complete analysis (what `predict` answers
from) as it was.

The real service (stdio); the `forges` entry point writes the bytes the test gives it to the
worker's channel, as user code can.
"""

from __future__ import annotations

import msgpack
import pytest

from service_client import ServiceProcess, copy_project, zombie_children

pytestmark = pytest.mark.timeout(180)

TINY = "tiny/entry_point.py"
FORGES = "forges/entry_point.py"


def nested(depth):
    value = None
    for _ in range(depth):
        value = [value]
    return value


FORGED = {
    "a result whose document is not a map": msgpack.packb({"type": "result", "document": [1, 2]}),
    "a result whose models predict cannot read": msgpack.packb(
        {"type": "result", "document": {"models": {"run_time_ms": 5}, "device": {"memory_capacity_bytes": 1 << 30}}}
    ),
    "a result whose imports name a path, not a module": msgpack.packb(
        {"type": "result", "document": {"models": None}, "imports": ["../../etc/passwd"]}
    ),
    "a result whose imports are not a list": msgpack.packb(
        {"type": "result", "document": {"models": None}, "imports": "transformers"}
    ),
    "a result whose known memory is not a map": msgpack.packb(
        {"type": "result", "document": {"models": None}, "known_memory": ["forged"]}
    ),
    "a progress of the wrong types": msgpack.packb({"type": "progress", "phase": ["x"], "fraction": "half"}),
    "a progress past 1": msgpack.packb({"type": "progress", "phase": "measuring", "fraction": 7.5}),
    "a partial nested too deep": msgpack.packb({"type": "partial", "document": {"a": nested(100)}}),
    "an error of a kind only the service tells": msgpack.packb(
        {"type": "error", "kind": "superseded", "message": "x", "path": None, "line": None}
    ),
    "an error whose message is not a string": msgpack.packb({"type": "error", "kind": "user_code", "message": 5}),
    "a second started, which would restart the time limit": msgpack.packb({"type": "started", "pid": 1}),
    "a second ready, which would change the device clients are told of": msgpack.packb(
        {"type": "ready", "pid": 1, "device": {"type": "cuda", "name": "forged"}, "error": None}
    ),
    "an unknown type": msgpack.packb({"type": "surprise"}),
    "not a map": msgpack.packb([1, 2, 3]),
    "bytes that are no msgpack": b"\xc1\xc1\xc1",
    # A partial whose array header promises 12 million items: refused at the header, not decoded
    # (it grew the service from 22 MB to 1.77 GB).
    "an array header of 12 million items": b"\x82\xa4type\xa7partial\xa8document\xdd"
    + (12_000_000).to_bytes(4, "big")
    + b"\xc0" * 64,
}


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return copy_project(tmp_path_factory.mktemp("worker-messages"))


@pytest.fixture(scope="module")
def service(root):
    service = ServiceProcess(root, "--quick")
    service.client = service.stdio_client()
    service.client.initialize()
    yield service
    service.stop()


@pytest.fixture(scope="module")
def complete(service):
    analysis_id, method, final = service.client.analyze(TINY)
    assert method == "analysis", final
    return analysis_id


@pytest.mark.parametrize("forged", list(FORGED), ids=list(FORGED))
def test_a_malformed_worker_message_ends_that_analysis_only(service, client, root, complete, forged):
    (root / "forges" / "message.msgpack").write_bytes(FORGED[forged])
    analysis_id, method, error = client.analyze(FORGES)
    assert (method, error["kind"]) == ("analysis_error", "worker_protocol"), error
    assert "malformed message" in error["message"]
    assert [m for m, _ in client.about(analysis_id) if m != "progress"] == ["analysis_error"]
    # Its worker was reaped before the error was sent.
    assert zombie_children(service.proc.pid) == []
    # predict still answers from the last good analysis.
    assert client.request("predict", {"batch_size": 8})["analysis_id"] == complete


def test_a_forged_known_memory_is_handed_on_and_taken_for_nothing(service, client, root):
    """A well-formed result's `known_memory` is the worker's word: the service keeps it for the
    next analysis of the same entry point, whose worker reads what it can
    (analysis/known_memory.py) and measures everything itself."""
    forged = {"code": {FORGES: "0" * 64}, "device": "forged", "memory": [[8, {"start_bytes": -1}]], "no_growth": True}
    (root / "forges" / "message.msgpack").write_bytes(
        msgpack.packb({"type": "result", "document": {"models": None}, "known_memory": forged})
    )
    _, method, _ = client.analyze(FORGES)
    assert method == "analysis"  # accepted: a map, whatever it holds
    # The same entry point, now a model that trains: its worker is handed the forged map.
    entry, model = root / "forges" / "entry_point.py", root / "forges" / "model.py"
    forging = entry.read_text()
    try:
        entry.write_text((root / "tiny" / "entry_point.py").read_text())
        model.write_text((root / "tiny" / "model.py").read_text())
        _, method, final = client.analyze(FORGES)
        assert method == "analysis", final
        assert final["document"]["reused"] is None and final["document"]["models"] is not None
    finally:
        entry.write_text(forging)
        model.unlink()
