"""Profiling from the editor, end to end with the real engine on the default example: per-line
annotations on the document's lines, the breakdown float, stale marking, profile on save."""

import itertools
import shutil
from pathlib import Path

import pytest

from conftest import REPO
from engine_helpers import marked_line
from nvim_helpers import (
    FAST_SETUP,
    annotations,
    assert_no_traceback,
    document,
    expected_annotation,
    expected_grade,
    messages,
    profile,
    state,
    wait_for,
    wait_for_done,
    wait_for_message,
)


def expected_rows(doc, relative_path):
    """{0-based row: text} the document says `relative_path` should show."""
    rows = {}
    for record in doc["lines"]:
        text = expected_annotation(record, doc["iteration"])
        if record["path"] == relative_path and text:
            rows[record["line"] - 1] = text
    return rows


def test_profile_annotates_every_project_buffer_on_the_documents_lines(nvim, project):
    nvim.exec_lua(FAST_SETUP)
    nvim.command(f"edit {project}/model.py")
    model_buf = nvim.current.buffer
    nvim.command(f"edit {project}/entry_point.py")
    entry_buf = nvim.current.buffer

    result = profile(nvim)

    doc = document(nvim)
    assert doc["entry_point"] == "entry_point.py"
    assert result["running"] is False and result["stale"] is False
    assert result["batch_size"] == doc["batch_size"] == 128
    assert result["measured"]["samples_per_second"] == doc["iteration"]["samples_per_second"]
    for buf, path in ((entry_buf, "entry_point.py"), (model_buf, "model.py")):
        shown = annotations(nvim, buf)
        expected = expected_rows(doc, path)
        assert expected, f"the document has no lines for {path}"
        assert {row: text for row, (text, _) in shown.items()} == expected
        graded = {r["line"] - 1: expected_grade(r, doc["iteration"]) for r in doc["lines"] if r["path"] == path}
        assert {row: group for row, (_, group) in shown.items()} == {row: graded[row] for row in shown}
    ns = nvim.api.create_namespace("skyline")
    details = nvim.api.buf_get_extmarks(entry_buf, ns, 0, -1, {"details": True})[0][3]
    assert details["virt_text_pos"] == "eol_right_align"

    # A project file opened after the results arrived is annotated too; so are the
    # measured numbers next to the batch_size literal, and the statusline.
    nvim.command("bwipeout! " + str(model_buf.number))
    nvim.command(f"edit {project}/model.py")
    shown = annotations(nvim, nvim.current.buffer)
    assert {row: text for row, (text, _) in shown.items()} == expected_rows(doc, "model.py")
    status = nvim.exec_lua("return require('skyline').status()")
    assert status.startswith("skyline b=128 ") and "/s" in status
    assert_no_traceback(nvim)


def test_breakdown_float_shows_the_results_and_jumps_to_lines(nvim, project):
    nvim.exec_lua(FAST_SETUP)
    nvim.command(f"edit {project}/entry_point.py")
    origin = nvim.current.window
    profile(nvim)
    doc = document(nvim)

    nvim.command("SkylineBreakdown")
    window = nvim.current.window
    assert nvim.api.win_get_config(window)["relative"] == "editor"
    lines = nvim.current.buffer[:]
    text = " ".join(line.strip() for line in lines)  # as one line: the float wraps long ones to its width
    measured = f"{round(doc['iteration']['samples_per_second']):,} samples/s measured at batch size 128"
    assert measured in lines[0]
    # Shown when the models have one (a run-time line that does not grow has none) whose limit is
    # not below a throughput measured (lua/skyline/float/throughput.lua: that would contradict the
    # measurements, as a noisy run's check can).
    knee = doc["models"].get("throughput_knee_batch_size")
    measured_rates = [doc["iteration"]["samples_per_second"]]
    measured_rates += [p["measured"]["samples_per_second"] for p in doc["predictions"] if p.get("measured")]
    consistent = (doc["models"].get("asymptotic_samples_per_second") or 0) >= max(measured_rates)
    assert ("knee: " in text) == (knee is not None and consistent)
    if knee is not None and consistent:
        assert f"at batch size {knee:,} (90% of" in text
    start = next(i for i, line in enumerate(lines) if line.startswith("Memory"))
    beneath = itertools.takewhile(lambda line: line.startswith(" " * 14), lines[start + 1 :])  # its wrapped lines
    memory = " ".join([lines[start], *beneath])
    assert "(cpu, " in memory and set("█░") & set(lines[start])
    header = next(i for i, line in enumerate(lines) if line.startswith("Batch size"))
    chart = lines[header + 1 : lines.index("", header)]
    chart_sizes = [p["batch_size"] for p in doc["predictions"]]
    for size in chart_sizes:
        assert any(f"{size:,}" in line for line in chart), size
    assert any(line.startswith("▸") and " 128 " in line for line in lines)  # the current batch size
    assert any(line.startswith("Operations") for line in lines)
    body = next(i for i, line in enumerate(lines) if line.strip().startswith("body"))
    assert "model.py:19" in lines[body]

    nvim.api.win_set_cursor(window, [body + 1, 0])
    nvim.input("<CR>")
    wait_for(lambda: nvim.current.buffer.name.endswith("model.py"), "the jump to model.py", timeout=10)
    assert nvim.current.window == origin
    assert nvim.current.window.cursor[0] == 19
    assert not any(nvim.api.win_get_config(w)["relative"] for w in nvim.api.list_wins())

    nvim.command("SkylineBreakdown")
    nvim.input("q")
    wait_for(lambda: len(nvim.api.list_wins()) == 1, "the float to close", timeout=10)
    nvim.command("SkylineBreakdown")
    nvim.command("SkylineBreakdown")  # toggles it closed
    assert len(nvim.api.list_wins()) == 1
    assert_no_traceback(nvim)


def test_edits_mark_annotations_stale_until_the_save_reprofiles(nvim, project):
    nvim.exec_lua(
        "require('skyline').setup({engine_args = {'--quick'}, device = 'cpu',"
        " virt_text_pos = 'eol', save_debounce_ms = 50})"
    )
    nvim.command(f"edit {project}/model.py")
    model_buf = nvim.current.buffer
    nvim.command(f"edit {project}/entry_point.py")
    profile(nvim)
    ns = nvim.api.create_namespace("skyline")
    assert nvim.api.buf_get_extmarks(model_buf, ns, 0, -1, {"details": True})[0][3]["virt_text_pos"] == "eol"
    before = annotations(nvim, model_buf)

    # A new line above everything: the marks move with their lines, dimmed.
    nvim.api.buf_set_lines(model_buf, 0, 0, True, ["# a comment"])
    wait_for(lambda: state(nvim)["stale"], "stale marking", timeout=10)
    after = annotations(nvim, model_buf)
    assert {row + 1: text for row, (text, _) in before.items()} == {row: text for row, (text, _) in after.items()}
    assert {group for _, group in after.values()} == {"SkylineStale"}
    assert "(stale)" in nvim.exec_lua("return require('skyline').status()")
    # The entry point was not edited: its annotations keep their grades.
    assert "SkylineStale" not in {group for _, group in annotations(nvim, nvim.current.buffer).values()}

    # Writing a project file profiles again; the new results are not stale.
    done = nvim.vars["skyline_test_done"]
    nvim.command(f"buffer {model_buf.number}")
    nvim.command("write")
    wait_for_done(nvim, done + 1)
    assert state(nvim)["stale"] is False
    doc = document(nvim)
    shown = annotations(nvim, model_buf)
    assert sorted(shown) == sorted(r["line"] - 1 for r in doc["lines"] if r["path"] == "model.py")
    assert min(shown) >= 1  # the comment shifted everything down by one
    assert "SkylineStale" not in {group for _, group in shown.values()}
    assert_no_traceback(nvim)


def test_unsaved_changes_are_matched_to_the_profiled_file(nvim, project):
    nvim.exec_lua(FAST_SETUP)
    nvim.command(f"edit {project}/model.py")
    model = nvim.current.buffer
    nvim.api.buf_set_lines(model, 0, 0, True, ["# unsaved", "# lines"])
    nvim.command(f"edit {project}/entry_point.py")
    entry = nvim.current.buffer
    literal_row = next(i for i, line in enumerate(entry[:]) if "batch_size=128" in line)
    entry[literal_row] = entry[literal_row].replace("128", "64")  # unsaved too

    result = profile(nvim)

    doc = document(nvim)
    assert doc["batch_size"] == 64 and result["batch_size"] == 64  # the buffer's, not the file's
    # The engine profiled the file; its lines are drawn where they are in the buffer, dimmed.
    shown = annotations(nvim, model)
    assert {row: text for row, (text, _) in shown.items()} == {
        row + 2: text for row, text in expected_rows(doc, "model.py").items()
    }
    assert {group for _, group in shown.values()} == {"SkylineStale"}
    # The entry point differs from its file only by the batch size the request carried.
    assert "SkylineStale" not in {group for _, group in annotations(nvim, entry).values()}


def test_a_leak_found_by_the_real_engine_is_a_warning_over_the_line_that_made_it(nvim, tmp_path):
    """tests/projects/training_loops/keeps_graphs.py keeps each iteration's graph: through the
    service and the remote plugin, the document's `memory_growth` reaches the editor, which warns
    over model.py's `hidden = self.body(x)` (line 12) and keeps no batch-size models."""
    root = tmp_path / "training_loops"
    shutil.copytree(REPO / "tests" / "projects" / "training_loops", root, ignore=shutil.ignore_patterns("__pycache__"))
    nvim.exec_lua(FAST_SETUP)
    nvim.command(f"edit {root}/keeps_graphs.py")
    profile(nvim)
    doc = document(nvim)
    assert doc["memory_growth"]["lines"][0]["line"] == 12 and "models" not in doc  # null fields are dropped
    get = "return vim.diagnostic.get(vim.fn.bufadd(...), {namespace = require('skyline.diagnostics').ns})"
    warned = nvim.exec_lua(get, str(root / "model.py"))
    assert (warned[0]["lnum"], warned[0]["severity"]) == (11, 2)  # the largest first; 2: severity.WARN
    assert warned[0]["message"].startswith("tensors made here stay alive after every iteration: 64.0 KiB of the ")
    assert_no_traceback(nvim)


@pytest.fixture
def scripts_project(nvim, tmp_path) -> Path:
    """A copy of tests/projects/scripts, the editor set up and working in it."""
    project = tmp_path / "project"
    shutil.copytree(REPO / "tests" / "projects" / "scripts", project)
    nvim.exec_lua(FAST_SETUP)
    nvim.command(f"cd {project}")
    return project


def test_a_training_scripts_buffer_is_profiled_as_the_script(nvim, scripts_project):
    # A buffer that defines no provider and steps an optimizer is a training script: profiled as
    # itself (not the configured or last entry point), stopped before its checkpoint is saved.
    project = scripts_project
    nvim.command(f"edit {project}/model.py")
    model_buf = nvim.current.buffer
    nvim.command(f"edit {project}/train.py")
    script_buf = nvim.current.buffer

    result = profile(nvim)

    doc = document(nvim)
    assert doc["entry_point"] == "train.py" and doc["batch_size"] == 64 == result["batch_size"]
    for buf, path in ((script_buf, "train.py"), (model_buf, "model.py")):
        expected = expected_rows(doc, path)
        assert expected, f"the document has no lines for {path}"
        assert {row: text for row, (text, _) in annotations(nvim, buf).items()} == expected
    assert not (project / "checkpoint.pt").exists()

    # The batch-size key doubles the script's literal in its buffer (unsaved) and shows what the
    # script's models say at 128 (a run of the script measured it), and the re-profile measures the
    # script at 128, set in memory.
    assert doc["models"] is not None
    done = nvim.vars["skyline_test_done"]
    nvim.input("\\+")
    batch_line = marked_line(project / "train.py", "# BATCH") - 1
    wait_for(lambda: "default=128)" in script_buf[batch_line], "the key to double the literal", timeout=10)
    status = nvim.exec_lua("return require('skyline').status()")  # not the figures measured at 64
    assert (status.startswith("skyline b=128 ") and "/s " in status) or (
        status.startswith("skyline ") and "%" in status
    )
    wait_for_done(nvim, done + 1)
    doc = document(nvim)
    assert doc["batch_size"] == 128 and doc["batch_size_location"]["value"] == 128
    assert any("in memory: the file still says 64" in warning for warning in doc["warnings"])
    assert "default=64)" in (project / "train.py").read_text().splitlines()[batch_line]
    nvim.input("u")  # one undo step
    wait_for(lambda: "default=64)" in script_buf[batch_line], "undo", timeout=10)
    assert_no_traceback(nvim)


def test_a_scripts_own_arguments_follow_double_dash_and_stay_for_its_re_profiles(nvim, scripts_project):
    # `:SkylineProfile -- ARGS` runs the buffer's script as `python train.py ARGS` would; a plain
    # :SkylineProfile of the same script keeps them; `--` alone clears them.
    project = scripts_project
    nvim.command(f"edit {project}/train.py")
    checkpoint = project / "elsewhere.pt"
    profile(nvim, f"SkylineProfile -- --batch-size 16 --checkpoint {checkpoint}")
    doc = document(nvim)
    assert doc["batch_size"] == 16 and doc.get("batch_size_location") is None  # the command line sets it
    assert {8, 16, 32} <= {s["batch_size"] for s in doc["models"]["samples"]}  # set in their runs' arguments
    profile(nvim)
    assert document(nvim)["batch_size"] == 16
    profile(nvim, "SkylineProfile --")
    assert document(nvim)["batch_size"] == 64  # the option's default, in the file
    assert not checkpoint.exists() and not (project / "checkpoint.pt").exists()
    assert_no_traceback(nvim)


TYPO = """import torch


def skyline_input_provider(batch_size=16):
    return (torch.randn(batch_size, 8),)


def skyline_modle_provider():  # TYPO
    return torch.nn.Linear(8, 2)


def skyline_iteration_provider(model):
    def iteration(x):
        model(x).sum().backward()

    return iteration
"""


def test_a_misspelled_provider_is_named_every_time_and_no_other_entry_point_runs(nvim, scripts_project, tmp_path):
    # After an earlier profile, :SkylineProfile in a buffer with a misspelled provider profiled the
    # last entry point instead, silently; a second attempt showed no error at all.
    nvim.command(f"edit {scripts_project}/train.py")
    profile(nvim)
    other = tmp_path / "other"
    other.mkdir()
    (other / "entry_point.py").write_text(TYPO)
    nvim.command(f"edit {other}/entry_point.py")
    said = (
        f"entry_point.py:{marked_line(TYPO, '# TYPO')}: `skyline_modle_provider` looks like `skyline_model_provider`, "
        "misspelled: the entry point does not define `skyline_model_provider`."
    )
    for attempt in (1, 2):
        before = nvim.vars["skyline_test_failed"]
        nvim.command("messages clear")
        nvim.command("SkylineProfile")
        wait_for(lambda: nvim.vars["skyline_test_failed"] > before, f"attempt {attempt} to fail", timeout=120)  # noqa: B023
        assert said in nvim.vars["skyline_test_failure"]
        # In the message area each time, its start (the line is cut to the screen's width).
        wait_for_message(nvim, f"skyline: entry_point.py:{marked_line(TYPO, '# TYPO')}: `skyline_modle_provider`")
        assert "profiling entry_point.py" in messages(nvim) and "train.py" not in messages(nvim)
    assert_no_traceback(nvim)
