"""Whatever the user's code does, the service survives it and says what happened.

One real service (stdio) for the module, with a 2 GiB address-space limit on its workers so that
the entry point that allocates until allocation fails cannot hurt the machine. Each fault ends
in an `analysis_error` of the right kind, and a normal analysis on the same service succeeds
afterwards.
"""

from __future__ import annotations

import os
import signal

import pytest

from engine_helpers import marked_line
from service_client import ServiceProcess, copy_project, process_gone
from skyline_engine.service.failures import MAX_DETAILS_CHARS

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]  # the service

WORKER_MEMORY_LIMIT = "2G"  # torch imports and the tiny model runs well within it (checked below)


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return copy_project(tmp_path_factory.mktemp("faults"))


@pytest.fixture(scope="module")
def service(root):
    service = ServiceProcess(root, "--quick", "--worker-memory-limit", WORKER_MEMORY_LIMIT)
    service.client = service.stdio_client()
    service.client.initialize()
    yield service
    service.stop()


def assert_a_normal_analysis_succeeds(client):
    _, method, final = client.analyze("tiny/entry_point.py")
    assert method == "analysis", final
    assert final["document"]["models"] is not None


def test_a_worker_killed_with_sigkill(client):
    analysis_id = client.request("analyze", {"entry_point": "slow/entry_point.py"})["analysis_id"]
    client.wait_notification(
        lambda m, p: p.get("analysis_id") == analysis_id and p.get("phase") == "building the model"
    )
    worker = client.request("status")["worker_pid"]
    os.kill(worker, signal.SIGKILL)
    method, error = client.wait_final(analysis_id)
    assert method == "analysis_error"
    assert error["kind"] in (
        "crashed",
        "out_of_memory",
    )  # out_of_memory only if the kernel's OOM killer fired meanwhile
    assert error["signal"] == "SIGKILL"
    assert "killed" in error["message"]
    assert "building the model" in error["message"]  # the step it was in
    assert process_gone(worker)
    assert_a_normal_analysis_succeeds(client)


def test_an_entry_point_that_calls_os_exit(client, root):
    _, method, error = client.analyze("exits/entry_point.py")
    assert method == "analysis_error"
    assert error["kind"] == "crashed"
    assert error["exit_status"] == 3
    assert "exited with status 3" in error["message"]
    assert_a_normal_analysis_succeeds(client)


def test_an_entry_point_that_loops_forever_meets_the_time_limit(client, root):
    _, method, error = client.analyze("loops/entry_point.py", time_limit_s=3)
    assert method == "analysis_error"
    assert error["kind"] == "time_limit"
    assert "time limit of 3 s" in error["message"]
    # The stacks the worker wrote before it was stopped point at the loop: its body, or the
    # `while` line above it, where CPython puts the jump back.
    assert error["path"] == "loops/entry_point.py"
    body = marked_line(root / "loops/entry_point.py")
    assert error["line"] in (body - 1, body)
    assert_a_normal_analysis_succeeds(client)


def test_an_entry_point_that_allocates_until_it_fails(client, root):
    _, method, error = client.analyze("allocates/entry_point.py")
    assert method == "analysis_error"
    assert error["kind"] == "out_of_memory"
    assert "out of memory" in error["message"]
    assert error["path"] == "allocates/entry_point.py"
    assert error["line"] == marked_line(root / "allocates/entry_point.py")
    assert_a_normal_analysis_succeeds(client)


def test_an_entry_point_that_segfaults(client, root):
    _, method, error = client.analyze("crashes/entry_point.py")
    assert method == "analysis_error"
    assert error["kind"] == "crashed"
    assert error["signal"] == "SIGSEGV"
    assert "segmentation fault" in error["message"]
    assert error["path"] == "crashes/entry_point.py"  # from faulthandler's dump
    assert error["line"] == marked_line(root / "crashes/entry_point.py")
    assert_a_normal_analysis_succeeds(client)


def test_what_the_service_keeps_of_a_workers_output_is_bounded(client, service):
    _, method, error = client.analyze("noisy/entry_point.py")
    assert (method, error["kind"], error["exit_status"]) == ("analysis_error", "crashed", 1)
    # The end of what the worker said, not all of its 24 MiB.
    assert error["details"].endswith("the last words")
    assert len(error["details"]) <= MAX_DETAILS_CHARS
    assert "the rest of this line is not logged" in service.log()
    assert len(service.log()) < 1 << 20
    assert_a_normal_analysis_succeeds(client)


def test_the_service_is_still_the_same_process(service):
    # Nothing above restarted it: every fault stayed inside a worker.
    assert service.alive()
    assert service.client.request("status")["analysis_id"] is None


@pytest.mark.timeout(120)
def test_a_memory_limit_too_small_for_torch_is_explained(root):
    service = ServiceProcess(root, "--quick", "--worker-memory-limit", "64M")
    try:
        client = service.stdio_client()
        info = client.initialize()
        assert info["device"] is None
        assert "--worker-memory-limit" in info["device_error"]
        _, method, error = client.analyze("tiny/entry_point.py")
        assert method == "analysis_error"
        assert error["kind"] in ("worker_start", "out_of_memory")
        assert "--worker-memory-limit" in error["message"]
    finally:
        service.stop()
