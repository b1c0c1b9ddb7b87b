"""The editor while the engine works, and when things go wrong: it keeps answering during an
analysis, results follow edits made meanwhile, stop, engine errors as diagnostics, a missing or
crashed engine, a remote engine and its token."""

import os
import signal

import pytest

from nvim_helpers import (
    FAST_SETUP,
    annotations,
    assert_no_traceback,
    document,
    expected_annotation,
    messages,
    profile,
    serving_remotely,
    shown_messages,
    state,
    wait_for,
    wait_for_done,
    wait_for_message,
)

# The model provider waits while a `hold` file exists next to the entry point: an analysis
# that is surely running until the test releases it.
HOLD = """
def skyline_model_provider():
    import pathlib, time
    hold = pathlib.Path(__file__).with_name("hold")
    deadline = time.monotonic() + 120
    while hold.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return MLPClassifier()
"""


@pytest.fixture
def held_project(project):
    entry = project / "entry_point.py"
    text = entry.read_text().replace("def skyline_model_provider():\n    return MLPClassifier()\n", HOLD.lstrip("\n"))
    entry.write_text(text)
    (project / "hold").write_text("")
    return project


def wait_until_building(nvim):
    """The worker is running the user's code (the model provider, held)."""
    wait_for(lambda: (state(nvim).get("progress") or {}).get("phase") == "building the model", "the analysis to start")


def test_the_editor_answers_while_an_analysis_runs(nvim, held_project):
    nvim.exec_lua(FAST_SETUP)
    nvim.command(f"edit {held_project}/entry_point.py")
    nvim.command("SkylineProfile")
    wait_until_building(nvim)

    assert nvim.eval("1 + 1") == 2
    assert nvim.api.get_mode() == {"mode": "n", "blocking": False}
    nvim.input("Go# typed while profiling<Esc>")
    wait_for(lambda: nvim.current.buffer[-1] == "# typed while profiling", "typed text", timeout=10)
    assert state(nvim)["running"] is True  # all of that happened during the analysis

    (held_project / "hold").unlink()
    wait_for_done(nvim, 1)
    assert state(nvim)["running"] is False
    assert_no_traceback(nvim)


def test_results_follow_edits_made_during_the_analysis(nvim, held_project):
    nvim.exec_lua(FAST_SETUP)
    nvim.command(f"edit {held_project}/model.py")
    model = nvim.current.buffer
    nvim.command(f"edit {held_project}/entry_point.py")
    nvim.command("SkylineProfile")
    wait_until_building(nvim)

    # Two lines above everything, and the `logits = self.head(hidden)` line (20) deleted.
    nvim.api.buf_set_lines(model, 0, 0, True, ["# one", "# two"])
    assert model[21].strip() == "logits = self.head(hidden)"
    nvim.api.buf_set_lines(model, 21, 22, True, [])
    (held_project / "hold").unlink()
    wait_for_done(nvim, 1)

    doc = document(nvim)
    expected = {}
    for record in doc["lines"]:
        if record["path"] == "model.py" and record["line"] != 20:
            shift = 2 if record["line"] < 20 else 1
            expected[record["line"] - 1 + shift] = expected_annotation(record, doc["iteration"])
    shown = annotations(nvim, model)
    assert {row: text for row, (text, _) in shown.items()} == expected
    assert {group for _, group in shown.values()} == {"SkylineStale"}
    assert state(nvim)["stale"] is True
    entry_groups = {group for _, group in annotations(nvim, nvim.current.buffer).values()}
    assert "SkylineStale" not in entry_groups
    assert_no_traceback(nvim)


def test_stop_ends_the_analysis_and_drops_its_results(nvim, held_project):
    nvim.exec_lua(FAST_SETUP)
    nvim.command(f"edit {held_project}/entry_point.py")
    nvim.command("SkylineProfile")
    wait_until_building(nvim)
    nvim.command("SkylineStop")
    wait_for_message(nvim, "profiling stopped")
    assert state(nvim)["running"] is False
    assert annotations(nvim, nvim.current.buffer) == {}
    (held_project / "hold").unlink()

    # The engine is still there for the next request. Whatever it says of the stopped analysis
    # (its `cancelled` end) comes on the same channel before anything of the next one, so once
    # the next profile is done, all of it has arrived: no second result, no failure, no message.
    profile(nvim)
    assert nvim.vars["skyline_test_done"] == 1 and nvim.vars["skyline_test_failed"] == 0
    assert annotations(nvim, nvim.current.buffer)
    assert "cancel" not in messages(nvim).split("profiling stopped")[-1]
    assert_no_traceback(nvim)


def test_engine_errors_become_diagnostics_at_their_line(nvim, project):
    model = project / "model.py"
    model.write_text(model.read_text().replace("hidden = self.body(features)", 'raise ValueError("broken on purpose")'))
    nvim.exec_lua(FAST_SETUP)
    nvim.command(f"edit {project}/entry_point.py")
    nvim.command("SkylineProfile")
    wait_for(lambda: nvim.vars["skyline_test_failed"], "the profile to fail")
    assert "broken on purpose" in nvim.vars["skyline_test_failure"]
    wait_for_message(nvim, "broken on purpose")
    diagnostics = nvim.exec_lua(
        "return vim.diagnostic.get(vim.fn.bufadd(...), {namespace = require('skyline.diagnostics').ns})", str(model)
    )
    assert [(d["lnum"], d["source"]) for d in diagnostics] == [(18, "skyline")]
    assert "broken on purpose" in diagnostics[0]["message"]
    # Over the statement: from its first non-blank character to the end of the line.
    statement = 'raise ValueError("broken on purpose")'
    assert (diagnostics[0]["col"], diagnostics[0]["end_col"]) == (8, 8 + len(statement))
    assert state(nvim)["running"] is False and "broken on purpose" in state(nvim)["error"]

    # One line in the message area, whatever the message's length; the full text is the
    # diagnostic's. The same failure again from a save (a re-profile nobody asked for while the
    # error stays) says nothing more; a profile the user asks for says it again.
    def said():
        return [line for line in shown_messages(nvim).splitlines() if "broken on purpose" in line]

    shown = said()
    assert len(shown) == 1 and nvim.funcs.strdisplaywidth(shown[0]) < nvim.options["columns"]
    nvim.command("write")
    wait_for(lambda: nvim.vars["skyline_test_failed"] == 2, "the same failure again, after the save")
    assert said() == shown
    nvim.command("SkylineProfile")
    wait_for(lambda: nvim.vars["skyline_test_failed"] == 3, "the same failure, asked for")
    wait_for(lambda: said() == shown * 2, "the failure said again when asked for", timeout=10)

    # A missing provider: the engine says which; the next profile clears the diagnostics.
    entry = project / "entry_point.py"
    entry.write_text(entry.read_text().replace("def skyline_iteration_provider", "def iteration_provider"))
    nvim.command("edit!")
    nvim.command(f"SkylineProfile {entry}")
    wait_for(lambda: nvim.vars["skyline_test_failed"] == 4, "the next failure")
    assert "skyline_iteration_provider" in nvim.vars["skyline_test_failure"]
    assert not nvim.exec_lua(
        "return vim.diagnostic.get(vim.fn.bufadd(...), {namespace = require('skyline.diagnostics').ns})", str(model)
    )
    assert_no_traceback(nvim)


def test_a_missing_engine_interpreter_is_reported(nvim, project):
    nvim.exec_lua("require('skyline').setup({python = '/no/such/python'})")
    nvim.command(f"edit {project}/entry_point.py")
    nvim.command("SkylineProfile")
    wait_for_message(nvim, "cannot start the engine with '/no/such/python'")
    assert state(nvim)["running"] is False
    assert_no_traceback(nvim)


def test_a_crashed_engine_is_reported_and_restarted(nvim, project, nvim_session):
    nvim.exec_lua(FAST_SETUP)
    nvim.command(f"edit {project}/entry_point.py")
    profile(nvim)
    pid = nvim.exec_lua("return require('skyline.state').engine.pid")
    os.kill(pid, signal.SIGKILL)
    text = wait_for_message(nvim, "the engine exited with status -9")
    assert "the next profile starts it again" in text
    assert (nvim_session.log_dir / "engine.log").exists()

    profile(nvim)
    assert nvim.exec_lua("return require('skyline.state').engine.pid") != pid
    assert annotations(nvim, nvim.current.buffer)
    assert_no_traceback(nvim)


@pytest.fixture
def remote_engine(project, tmp_path):
    """`skyline serve --listen` on a free port, serving the project: (address, token file)."""
    token_file = tmp_path / "state" / "token"
    with serving_remotely(project, "--token-file", str(token_file)) as address:
        yield address, token_file


def test_a_remote_engine_needs_the_right_token(nvim, project, remote_engine, tmp_path):
    address, token_file = remote_engine
    wrong = tmp_path / "wrong-token"
    wrong.write_text("not-the-token\n")
    nvim.exec_lua(FAST_SETUP)
    nvim.command(f"edit {project}/entry_point.py")

    nvim.command(f"SkylineConnect {address} {wrong}")
    wait_for_message(nvim, "refused the token")

    nvim.command(f"SkylineConnect {address} {token_file}")
    wait_for_message(nvim, f"connected to the engine at {address}")
    profile(nvim)
    doc = document(nvim)
    assert doc["project_root"] == str(project)
    assert annotations(nvim, nvim.current.buffer)
    assert "refused" not in shown_messages(nvim).split("connected to the engine")[-1]
    nvim.command("SkylineConnect local")
    wait_for_message(nvim, "the next profile uses the local engine")
    assert_no_traceback(nvim)


def test_editing_the_literal_while_a_reprofile_runs(nvim, held_project):
    (held_project / "hold").unlink()
    nvim.exec_lua(FAST_SETUP)
    nvim.command(f"edit {held_project}/entry_point.py")
    profile(nvim)
    row = next(i for i, line in enumerate(nvim.current.buffer[:]) if "batch_size=128" in line)

    (held_project / "hold").write_text("")
    nvim.input("<Plug>(skyline-batch-inc)")  # 256, measured by a re-profile that is held
    wait_until_building(nvim)
    start = nvim.current.buffer[row].index("256")
    nvim.api.buf_set_text(0, row, start, row, start + 3, ["32"])  # the user types over the digits
    wait_for(lambda: state(nvim)["batch_size"] == 32, "the prediction to follow the edit", timeout=10)
    (held_project / "hold").unlink()
    wait_for(
        lambda: state(nvim)["measured"]["batch_size"] == 32 and not state(nvim)["running"], "the measurement at 32"
    )
    assert document(nvim)["batch_size"] == 32
    assert "batch_size=32" in nvim.current.buffer[row]
    assert_no_traceback(nvim)
