"""`skyline serve`'s documented options and protocol rules not covered elsewhere, against the real
service (docs/protocol.md): the service-wide time limit, --verbose, the timing budget's bounds,
unknown parameters ignored and nil taken as absent, `shutting_down`; and the `skyline` console
script itself (the other tests run `python -m skyline_engine`).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import skyline_engine
from engine_helpers import marked_line
from service_client import ServiceProcess, copy_project

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]  # the service

SLOW = "slow/entry_point.py"
TINY = "tiny/entry_point.py"


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return copy_project(tmp_path_factory.mktemp("options"))


def test_the_services_time_limit_stops_an_analysis_that_asks_for_none(root):
    service = ServiceProcess(root, "--quick", "--time-limit", "2", "--verbose")
    try:
        client = service.stdio_client()
        client.initialize()
        _, method, error = client.analyze(SLOW)
        assert (method, error["kind"]) == ("analysis_error", "time_limit")
        # The stacks asked of the worker before it was stopped say where it was.
        here = marked_line(root / SLOW)
        assert (error["path"], error["line"]) == (SLOW, here)
        assert error["message"].startswith(
            f"{SLOW}:{here}: the analysis ran longer than its time limit of 2 s and was stopped (it was building "
            "the model)."
        )
    finally:
        service.stop()
    log = service.log_path.read_text(encoding="utf-8", errors="replace")
    assert "started worker" in log  # --verbose: the debug lines


def test_without_verbose_the_log_has_no_debug_lines(root):
    service = ServiceProcess(root, "--quick")
    try:
        client = service.stdio_client()
        client.initialize()
        client.request("status")
    finally:
        service.stop()
    assert "started worker" not in service.log_path.read_text(encoding="utf-8", errors="replace")


def test_unknown_parameters_are_ignored_and_nil_is_absent(root):
    service = ServiceProcess(root, "--quick")
    try:
        client = service.stdio_client()
        client.initialize(client_name="a newer editor", protocol_extension=None)
        params = {"entry_point": TINY, "batch_size": None, "time_limit_s": None, "colour": "blue"}
        analysis_id = client.request("analyze", params)["analysis_id"]
        method, final = client.wait_final(analysis_id)
        assert method == "analysis", final
        assert final["document"]["batch_size"] == 16  # nil: the entry point's own default
    finally:
        service.stop()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--min-run-s", "2", "--max-run-s", "1"], "--min-run-s is larger than --max-run-s."),
        (["--time-limit", "0"], "the time limit"),
    ],
)
def test_inconsistent_budgets_are_refused_at_start(root, args, message):
    command = [sys.executable, "-m", "skyline_engine", "serve", "--stdio", "--project-root", str(root), *args]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False, stdin=subprocess.DEVNULL)
    assert result.returncode in (1, 2)
    assert message in result.stderr


def test_a_request_during_shutdown_starts_nothing_that_outlives_it(root):
    # Another client's request races the service's stop: it is refused (`shutting_down`), or
    # started and cancelled at once, or its connection is closed first; the service exits cleanly.
    service = ServiceProcess(root, "--quick", stdio=False)
    try:
        client, other = service.tcp_client(), service.tcp_client()
        client.initialize(token=service.token)
        other.initialize(token=service.token)
        assert client.request("shutdown") == {}
        try:
            error, started = other.call("analyze", {"entry_point": TINY})
        except ConnectionError:
            pass
        else:
            if error is None:
                method, final = other.wait_final(started["analysis_id"])
                assert (method, final["kind"]) == ("analysis_error", "cancelled"), final
            else:
                assert error["code"] == "shutting_down", error
                assert error["message"] in ("the engine is shutting down", "the connection is closing")
        assert service.proc.wait(60) == 0
    finally:
        service.stop()


def console_script() -> Path:
    script = Path(sys.executable).parent / "skyline"
    assert script.is_file(), f"the console script is not installed next to {sys.executable}"
    return script


def test_the_console_script_is_the_cli():
    def skyline(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(console_script()), *args], capture_output=True, text=True, timeout=60, check=False)

    result = skyline("--version")
    assert (result.returncode, result.stdout.strip()) == (0, f"skyline {skyline_engine.__version__}")
    result = skyline("profile", "no/such/entry_point.py", "--quiet")
    assert result.returncode == 1
    assert result.stderr.startswith("skyline: error: the entry point 'no/such/entry_point.py' does not exist")
