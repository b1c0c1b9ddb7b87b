"""Documented options and commands doing what doc/skyline.txt says, in a real Neovim with the real
engine: `entry_point`, the fallback to the last entry point, `project_root`, `time_limit_s`,
`float_border`, and `:SkylineConnect` reading the default token file.

Outcomes only: which entry point was analysed, the root the document names, the window's border,
the message a stopped analysis gives. None depends on how fast the machine is: the entry point
that meets the time limit never returns at all.
"""

from __future__ import annotations

import shutil

import pytest

from engine_helpers import marked_line
from nvim_helpers import (
    annotations,
    assert_no_traceback,
    document,
    profile,
    serving_remotely,
    wait_for,
    wait_for_message,
)
from service_client import ENTRY_POINTS

QUICK = "engine_args = {'--quick'}, device = 'cpu', profile_on_save = false, reprofile_delay_ms = 100"


def setup(nvim, options: str = "") -> None:
    nvim.exec_lua(f"require('skyline').setup({{{QUICK}{', ' + options if options else ''}}})")


def test_the_configured_entry_point_is_profiled_from_a_buffer_that_is_not_one(nvim, project):
    setup(nvim, f"entry_point = '{project}/entry_point.py'")
    nvim.command(f"edit {project}/model.py")  # Python, but without the providers

    profile(nvim)

    assert document(nvim)["entry_point"] == "entry_point.py"
    assert annotations(nvim, nvim.current.buffer), "model.py shows its costs"
    assert_no_traceback(nvim)


def test_without_an_entry_point_in_sight_the_last_one_is_profiled_again(nvim, project, tmp_path):
    setup(nvim)
    nvim.command(f"edit {project}/entry_point.py")
    profile(nvim)
    notes = tmp_path / "notes.md"
    notes.write_text("# not Python\n")
    nvim.command(f"edit {notes}")

    profile(nvim)  # waits for a second SkylineProfileDone

    assert nvim.vars["skyline_test_done"] == 2
    assert document(nvim)["entry_point"] == "entry_point.py"
    assert_no_traceback(nvim)


def test_the_configured_project_root_is_the_documents_root(nvim, project):
    outer = project.parent
    setup(nvim, f"project_root = '{outer}'")
    nvim.command(f"edit {project}/model.py")
    model_buf = nvim.current.buffer
    nvim.command(f"edit {project}/entry_point.py")

    profile(nvim)

    doc = document(nvim)
    assert doc["project_root"] == str(outer)
    assert doc["entry_point"] == "project/entry_point.py"
    assert {record["path"] for record in doc["lines"]} >= {"project/model.py"}
    assert annotations(nvim, model_buf), "lines under the configured root are annotated"
    assert_no_traceback(nvim)


def test_the_configured_time_limit_stops_an_analysis_that_never_ends(nvim, tmp_path):
    project = tmp_path / "loops"
    shutil.copytree(ENTRY_POINTS / "loops", project, ignore=shutil.ignore_patterns("__pycache__"))
    setup(nvim, "time_limit_s = 4")
    nvim.command(f"edit {project}/entry_point.py")

    nvim.command("SkylineProfile")

    wait_for(lambda: nvim.vars["skyline_test_failed"], "the analysis to be stopped")
    failure = nvim.vars["skyline_test_failure"]
    assert "time limit of 4 s" in failure, failure
    # The place is the loop's: its body, or the `while` line above it, where CPython puts the jump
    # back (which of the two depends on the instruction the worker was stopped at).
    body = marked_line(project / "entry_point.py")
    assert any(f"entry_point.py:{line}:" in failure for line in (body - 1, body)), failure
    assert nvim.vars["skyline_test_done"] == 0
    assert_no_traceback(nvim)


def test_the_configured_border_frames_the_breakdown(nvim, project):
    border = ["+", "-", "+", "|", "+", "-", "+", "|"]
    setup(nvim, "float_border = {" + ", ".join(f"'{c}'" for c in border) + "}")
    nvim.command(f"edit {project}/entry_point.py")
    profile(nvim)

    nvim.command("SkylineBreakdown")

    config = nvim.api.win_get_config(nvim.current.window)
    assert config["relative"] == "editor"
    assert [part[0] if isinstance(part, list) else part for part in config["border"]] == border
    assert_no_traceback(nvim)


@pytest.fixture
def remote_engine_with_default_token(nvim_session, project):
    """`skyline serve --listen` that writes its token where both sides look by default: the
    editor's $XDG_STATE_HOME/skyline/token (no --token-file on either side)."""
    state_home = nvim_session.home / "state"
    token_file = state_home / "skyline" / "token"
    try:
        with serving_remotely(project, env={"XDG_STATE_HOME": str(state_home)}) as address:
            assert token_file.exists(), "the service wrote no token at the default path"
            yield address
    finally:
        token_file.unlink(missing_ok=True)


def test_connect_reads_the_default_token_file(nvim, project, remote_engine_with_default_token):
    address = remote_engine_with_default_token
    setup(nvim)
    nvim.command(f"edit {project}/entry_point.py")

    nvim.command(f"SkylineConnect {address}")
    wait_for_message(nvim, f"connected to the engine at {address}")
    profile(nvim)

    assert document(nvim)["project_root"] == str(project)
    assert annotations(nvim, nvim.current.buffer)
    assert "refused" not in wait_for_message(nvim, "connected")
    assert_no_traceback(nvim)
