"""The engine service over stdio, as the editor runs it: the real `skyline serve --stdio` in a
subprocess, driven by a real msgpack-RPC client.

One service serves the whole module (workers import torch: seconds each); tests that end the
service start their own. `--quick` keeps each analysis of the tiny model to a few seconds.
"""

from __future__ import annotations

import shutil
import signal
from pathlib import Path

import pytest

import skyline_engine
from engine_helpers import marked_line
from nvim_helpers import documented_run_time
from service_client import (
    ServiceProcess,
    copy_project,
    deeply_nested,
    process_gone,
    request_with_deep_params,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]  # the service

TINY = "tiny/entry_point.py"
SLOW = "slow/entry_point.py"


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return copy_project(tmp_path_factory.mktemp("stdio"))


@pytest.fixture(scope="module")
def service(root):
    service = ServiceProcess(root, "--quick")
    client = service.stdio_client()
    # Before `initialize`, every other request is refused; recorded here, checked below.
    service.before_initialize = client.call("analyze", {"entry_point": TINY})
    service.initialized = client.initialize()
    service.client = client
    yield service
    service.stop()


def test_requests_before_initialize_are_refused(service):
    error, result = service.before_initialize
    assert result is None
    assert error["code"] == "not_initialized"
    assert "initialize" in error["message"]


def test_initialize_describes_the_engine(service, root):
    info = service.initialized
    assert info["protocol_version"] == 1
    assert info["engine_version"] == skyline_engine.__version__
    assert info["server_root"] == str(root.resolve())
    assert info["device"]["type"] == "cpu"
    assert info["device"]["memory_capacity_bytes"] > 0


def test_a_second_initialize_is_refused(client):
    error, _ = client.call("initialize", {"protocol_version": 1})
    assert error["code"] == "already_initialized"


def test_analysis_reports_progress_then_partial_then_complete(client, root):
    analysis_id, method, final = client.analyze(TINY)
    assert method == "analysis", final
    messages = client.about(analysis_id)
    kinds = [(m, p.get("partial")) for m, p in messages]
    assert kinds.index(("analysis", True)) < kinds.index(("analysis", False)) == len(kinds) - 1
    assert kinds[0][0] == "progress"
    progress = [p for m, p in messages if m == "progress"]
    assert all(0.0 <= p["fraction"] <= 1.0 and p["phase"] for p in progress)
    partials = [p["document"] for m, p in messages if m == "analysis" and p["partial"]]
    # First one recorded iteration broken down (its time from that iteration), then the user's
    # batch size timed in full, before the other batch sizes are probed.
    assert next(d["iteration"]["repetitions"] for d in partials) == 1
    assert len(partials) == 2 and partials[1]["iteration"]["repetitions"] > 1
    for partial in partials:
        assert partial["models"] is None and partial["iteration"]["run_time_ms"] > 0
        # The per-line breakdown arrives with the first result, before the batch-size models.
        assert any(line["path"] == "tiny/model.py" and line["forward_ms"] > 0 for line in partial["lines"])
    document = final["document"]
    assert document["schema"] == "skyline.analysis/1"
    assert document["project_root"] == str(root.resolve())
    assert document["entry_point"] == TINY
    assert document["batch_size"] == 16
    assert document["models"] is not None and document["predictions"]


def test_a_data_parallel_analysis_runs_its_ranks_from_the_worker(client):
    analysis_id, method, final = client.analyze(TINY, world_size=2)
    assert method == "analysis", final
    document = final["document"]
    assert document["distributed"]["world_size"] == 2 and len(document["distributed"]["ranks"]) == 2
    assert any(line["communication_ms"] is not None for line in document["lines"])
    phases = [p["phase"] for m, p in client.about(analysis_id) if m == "progress"]
    assert "starting 2 processes" in phases and "timing the link" in phases  # rank 0's, relayed


def test_predict_answers_from_the_latest_models(client):
    analysis_id, method, final = client.analyze(TINY)
    assert method == "analysis", final
    prediction = client.request("predict", {"batch_size": 64})
    models = final["document"]["models"]
    assert prediction["analysis_id"] == analysis_id
    # The formulas of docs/analysis-document.md, applied here to the document's models.
    line = models["run_time_ms"]
    if line["slope"] > 0 and (line["r2"] >= 0.95 or line["max_relative_residual"] <= 0.01):
        run_time_ms = documented_run_time(models, 64)
        assert prediction["run_time_ms"] == pytest.approx(run_time_ms, rel=1e-12)
        assert prediction["samples_per_second"] == pytest.approx(64 / run_time_ms * 1000, rel=1e-12)
    else:  # a busy machine's noise: the line predicts no time
        assert prediction["run_time_ms"] is None and prediction["samples_per_second"] is None
    peak = max(phase["slope"] * 64 + phase["bias"] for phase in models["peak_memory_bytes"]["phases"])
    assert prediction["peak_memory_bytes"] == pytest.approx(peak, rel=1e-12)
    assert prediction["fits"] is (peak <= models["usable_memory_bytes"])


def test_the_service_checks_results_and_predicts_without_loading_torch(service, client):
    """Only workers load torch: the service checks a result's models and answers `predict` with
    numpy alone. (Checking the models imported torch into the service: an editor's first complete
    analysis reached it 1.5-2 s after its worker had sent it, and a save meanwhile was measured
    beside the import.)"""
    _, method, final = client.analyze(TINY)
    assert method == "analysis" and final["document"]["models"] is not None, final
    assert client.request("predict", {"batch_size": 64})["peak_memory_bytes"] > 0
    libraries = {line.split()[-1] for line in Path(f"/proc/{service.proc.pid}/maps").read_text().splitlines()}
    assert any("msgpack" in path for path in libraries)  # the maps list the service's own libraries
    assert not [path for path in libraries if "libtorch" in path]


@pytest.mark.parametrize(
    "method, params, parameter",
    [
        ("analyze", {}, "entry_point"),
        ("analyze", {"entry_point": 5}, "entry_point"),
        ("analyze", {"entry_point": TINY, "batch_size": "32"}, "batch_size"),
        ("analyze", {"entry_point": TINY, "batch_size": True}, "batch_size"),
        ("analyze", {"entry_point": TINY, "batch_size": 0}, "batch_size"),
        ("predict", {"batch_size": 2.5}, "batch_size"),
        ("cancel", {"analysis_id": "1"}, "analysis_id"),
    ],
)
def test_wrong_parameters_get_errors_naming_them(client, method, params, parameter):
    error, _ = client.call(method, params)
    assert error["code"] == "invalid_params"
    assert error["param"] == parameter
    assert parameter in error["message"]


def test_unknown_methods_and_malformed_requests_get_error_responses(client):
    error, _ = client.call("profile_everything")
    assert error["code"] == "method_not_found"
    client.send([0, 9001, "predict", {"batch_size": 8}])  # params not in an array
    error, _ = client.wait_response(9001)
    assert error["code"] == "invalid_params"
    client.send([0, 9002, "predict", [{1: 2}]])  # a map with an integer key
    error, _ = client.wait_response(9002)
    assert error["code"] == "invalid_params"
    assert client.request("status")["analysis_id"] is None  # still serving


def test_an_entry_point_that_does_not_exist_is_an_analysis_error(client):
    _, method, final = client.analyze("nowhere/entry_point.py")
    assert method == "analysis_error"
    assert final["kind"] == "entry_point"
    assert "does not exist" in final["message"]


def test_a_user_code_error_names_the_line(client, root):
    _, method, final = client.analyze("broken/entry_point.py")
    assert method == "analysis_error"
    assert final["kind"] == "user_code"
    assert final["path"] == "broken/entry_point.py"
    assert final["line"] == marked_line(root / "broken/entry_point.py")


def test_cancel_ends_the_analysis_and_its_worker(client):
    analysis_id = client.request("analyze", {"entry_point": SLOW})["analysis_id"]
    client.wait_notification(
        lambda m, p: p.get("analysis_id") == analysis_id and p.get("phase") == "building the model"
    )
    worker = client.request("status")["worker_pid"]
    assert client.request("cancel", {"analysis_id": analysis_id}) == {"cancelled": True}
    method, final = client.wait_final(analysis_id)
    assert (method, final["kind"]) == ("analysis_error", "cancelled")
    assert process_gone(worker)
    # Cancelling it again, or an id that never existed, changes nothing.
    assert client.request("cancel", {"analysis_id": analysis_id}) == {"cancelled": False}
    assert client.request("cancel", {"analysis_id": 10**6}) == {"cancelled": False}


def test_a_new_analysis_supersedes_the_running_one(client):
    first = client.request("analyze", {"entry_point": SLOW})["analysis_id"]
    client.wait_notification(lambda m, p: p.get("analysis_id") == first and p.get("phase") == "building the model")
    first_worker = client.request("status")["worker_pid"]
    second, method, final = client.analyze(TINY)
    assert second > first
    assert method == "analysis", final
    ended = [(m, p) for m, p in client.about(first) if m != "progress"]
    assert [(m, p["kind"]) for m, p in ended] == [("analysis_error", "superseded")]
    assert process_gone(first_worker)
    # predict speaks for the newest complete analysis.
    assert client.request("predict", {"batch_size": 8})["analysis_id"] == second


def test_edited_files_are_picked_up_by_the_next_analysis(client, root):
    entry, model = root / TINY, root / "tiny/model.py"
    entry_text, model_text = entry.read_text(), model.read_text()
    try:
        entry.write_text(entry_text.replace("batch_size=16", "batch_size=24"))
        model.write_text(
            model_text.replace("return self.linear(x).pow(2).mean()", "raise RuntimeError('edited')  # <- HERE")
        )
        _, method, final = client.analyze(TINY)
        assert (method, final["kind"], final["path"]) == ("analysis_error", "user_code", "tiny/model.py")
        assert final["line"] == marked_line(model)
        model.write_text(model_text)
        _, method, final = client.analyze(TINY)
        assert method == "analysis", final
        assert final["document"]["batch_size"] == 24
    finally:
        entry.write_text(entry_text)
        model.write_text(model_text)


# 1,000 deep: 1 KB that msgpack decodes, whose repr recursed without end; 5,000 deep: past
# msgpack's own limit, which broke the stream.
@pytest.mark.parametrize("depth", [1000, 5000])
def test_a_frame_nested_too_deep_gets_an_error_and_the_service_stays(client, service, depth):
    client.send_raw(deeply_nested(depth))
    # The same inside a request: the answer is a response to its msgid.
    client.send_raw(request_with_deep_params(8000 + depth, depth))
    error, _ = client.wait_response(8000 + depth)
    assert error["code"] == "invalid_message" and "32 deep" in error["message"]
    assert [p["code"] for m, p in client.notifications if m == "protocol_error"][-1:] == ["invalid_message"]
    assert service.alive()
    assert client.request("status")["analysis_id"] is None


def test_user_prints_go_to_the_log(service):
    # The tiny model provider prints; every analysis above still decoded cleanly.
    assert "must not corrupt" in service.log()
    assert service.client.other == []


@pytest.mark.timeout(120)
def test_the_service_exits_when_stdin_closes_and_takes_its_workers(root):
    service = ServiceProcess(root, "--quick")
    try:
        client = service.stdio_client()
        client.initialize()
        analysis_id = client.request("analyze", {"entry_point": SLOW})["analysis_id"]
        client.wait_notification(lambda m, p: p.get("analysis_id") == analysis_id and m == "progress")
        worker = client.request("status")["worker_pid"]
        client.close()  # the editor quit
        assert service.proc.wait(60) == 0
        assert process_gone(worker)
    finally:
        service.stop()


@pytest.mark.timeout(120)
def test_shutdown_answers_then_ends_the_service(root):
    service = ServiceProcess(root, "--quick")
    try:
        client = service.stdio_client()
        client.initialize()
        spare = client.request("status")["spare_worker_pid"]
        assert client.request("shutdown") == {}
        assert service.proc.wait(60) == 0
        if spare is not None:
            assert process_gone(spare)
    finally:
        service.stop()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("how", ["shutdown", "SIGTERM"])
def test_stopping_the_service_mid_analysis_sends_its_one_final_notification(root, how):
    service = ServiceProcess(root, "--quick")
    try:
        client = service.stdio_client()
        client.initialize()
        analysis_id = client.request("analyze", {"entry_point": SLOW})["analysis_id"]
        client.wait_notification(
            lambda m, p: p.get("analysis_id") == analysis_id and p.get("phase") == "building the model"
        )
        worker = client.request("status")["worker_pid"]
        if how == "shutdown":
            assert client.request("shutdown") == {}
            # Already there when the answer came: it was sent before.
            assert [m for m, p in client.about(analysis_id) if m != "progress"] == ["analysis_error"]
        else:
            service.proc.send_signal(signal.SIGTERM)
        assert service.proc.wait(60) == 0
        assert client.wait_closed(30)
        finals = [(m, p) for m, p in client.about(analysis_id) if m != "progress"]
        assert [(m, p["kind"]) for m, p in finals] == [("analysis_error", "cancelled")]
        assert "shutting down" in finals[0][1]["message"]
        assert process_gone(worker)
    finally:
        service.stop()


@pytest.mark.timeout(60)
def test_malformed_msgpack_on_stdio_closes_the_stream(root):
    service = ServiceProcess(root, "--quick")
    try:
        client = service.stdio_client()
        client.send_raw(b"\xc1")  # never valid msgpack
        assert client.wait_closed(30)
        assert [m for m, _ in client.notifications] == ["protocol_error"]
        assert client.notifications[0][1]["code"] == "parse_error"
        assert service.proc.wait(30) == 0  # stdio has one client: closing it ends the service
    finally:
        service.stop()


def test_sigterm_ends_the_service_cleanly(root):
    service = ServiceProcess(root, "--quick")
    try:
        client = service.stdio_client()
        client.initialize()
        service.proc.send_signal(signal.SIGTERM)
        assert service.proc.wait(60) == 0
    finally:
        service.stop()


def test_the_next_worker_imports_ahead_the_installed_libraries_the_last_analysis_imported(tmp_path):
    """A save answered without re-importing the user's heavy libraries (issue "Fast enough"):
    pynvim stands in for one (installed, and never imported by the engine). A worker whose
    analysis changed os.environ passes nothing on: the user's code may set up a library before
    importing it."""
    root = copy_project(tmp_path)
    entry, text = root / TINY, (root / TINY).read_text()
    entry.write_text(text.replace("import torch\n", "import pynvim  # noqa: F401\nimport torch\n", 1))
    service = ServiceProcess(root, "--quick")
    try:
        client = service.stdio_client()
        client.initialize()

        def ahead() -> list[str]:
            _, method, final = client.analyze(TINY)
            assert method == "analysis", final
            return [c for c in final["document"]["runtime_changes"] if c.startswith("imported before your code ran")]

        assert ahead() == []  # the first worker started before any analysis
        imported = ahead()
        assert len(imported) == 1 and imported[0].startswith("imported before your code ran: pynvim (")
        setup = "import os\n\nos.environ['A_LIBRARYS_SETTING'] = '1'\nimport pynvim"
        entry.write_text(entry.read_text().replace("import pynvim", setup))
        assert len(ahead()) == 1  # imported ahead as the last analysis did; this one sets the environment
        assert ahead() == []
    finally:
        service.stop()


def test_the_next_analysis_of_unchanged_code_takes_the_memory_the_last_measured(tmp_path):
    """A save answered without measuring again what an unchanged model's memory was (issue "Fast
    enough"): the service hands each complete analysis's memory to the next worker analysing the
    same entry point, which takes it while the code is the same (analysis/known_memory.py), also
    after another entry point was analysed in between, and not once the model changes."""
    root = copy_project(tmp_path)
    shutil.copytree(root / "tiny", root / "other")
    service = ServiceProcess(root, "--quick")
    try:
        client = service.stdio_client()
        client.initialize()

        def reused(entry: str = TINY) -> dict | None:
            _, method, final = client.analyze(entry)
            assert method == "analysis", final
            return final["document"]["reused"]

        assert reused() is None
        taken = reused()
        assert taken is not None and taken["memory_batch_sizes"] and taken["memory_growth_check_skipped"]
        assert reused("other/entry_point.py") is None  # its own files: nothing known of them
        assert reused() is not None  # what the tiny model's last analysis measured is still kept
        model = root / "tiny" / "model.py"
        model.write_text(model.read_text().replace("nn.Linear(8, 4)", "nn.Linear(8, 6)"))
        assert reused() is None
    finally:
        service.stop()
