"""Batch-size keys and :SkylineBatchSize, end to end: the literal in the buffer, one undo step
per press, the prediction from the models at once, and the re-profile that measures it."""

import math

import pytest

from nvim_helpers import (
    FAST_SETUP,
    assert_no_traceback,
    document,
    predict,
    profile,
    state,
    wait_for,
    wait_for_message,
)
from skyline_engine.units import format_bytes

LITERAL_ROW = 11  # examples/default/entry_point.py: `def skyline_input_provider(batch_size=128):`


def literal_line(nvim):
    return nvim.current.buffer[LITERAL_ROW]


def assert_prediction(nvim, batch_size):
    """The figures shown at `batch_size`: where the last analysis measured it (for the models, else
    beside the user's batch size to confirm the recommendation), its measurement (one figure per
    batch size, as the chart shows it); elsewhere the models' prediction."""
    current = state(nvim)
    models = document(nvim)["models"]
    assert current["batch_size"] == batch_size
    measured = [*models["samples"], *models.get("checks", [])]
    sample = next((s for s in measured if s["batch_size"] == batch_size), None)
    if sample is not None:
        expected = {**sample, "measured": True, "fits": True, "extrapolated": False}
        assert {key: current["prediction"].get(key) for key in expected} == expected
        return
    assert not current["prediction"].get("measured")
    for key, value in predict(models, batch_size).items():  # no value (no time predicted) is an absent key in Lua
        assert current["prediction"].get(key) == (None if value is None else pytest.approx(value, rel=1e-9)), key


def hint(nvim) -> str:
    marks = nvim.api.buf_get_extmarks(0, nvim.api.create_namespace("skyline.batch"), 0, -1, {"details": True})
    assert [mark[1] for mark in marks] == [LITERAL_ROW]
    return marks[0][3]["virt_text"][0][0]


@pytest.fixture
def profiled(nvim, project):
    """The default example profiled, its entry point the current buffer, re-profiles slowed
    down so that the tests see the predictions before the measurements."""
    nvim.exec_lua(FAST_SETUP)
    nvim.command(f"edit {project}/entry_point.py")
    profile(nvim)
    nvim.exec_lua("require('skyline.config').get().reprofile_delay_ms = 600000")
    return nvim


def test_batch_keys_edit_the_literal_with_one_undo_step_per_press(profiled):
    nvim = profiled
    others = nvim.current.buffer[:]
    nvim.api.win_set_cursor(0, [3, 2])

    nvim.input("\\+")  # the default <LocalLeader>+ of the entry point's buffer
    wait_for(lambda: "batch_size=256" in literal_line(nvim), "the literal to become 256", timeout=10)
    assert_prediction(nvim, 256)
    # The analysis at 128 measured 256 too: its measurement, not the line through it.
    measured = next(s for s in document(nvim)["models"]["samples"] if s["batch_size"] == 256)
    assert hint(nvim).startswith(f"measured at 256: {round(measured['samples_per_second']):,} samples/s · ")
    assert "~" not in nvim.exec_lua("return require('skyline').status()")
    assert state(nvim)["measured"]["batch_size"] == 128  # not measured yet
    assert state(nvim)["stale"] is True
    assert tuple(nvim.current.window.cursor) == (3, 2)
    after = nvim.current.buffer[:]
    assert after[:LITERAL_ROW] + after[LITERAL_ROW + 1 :] == others[:LITERAL_ROW] + others[LITERAL_ROW + 1 :]
    assert after[LITERAL_ROW] == others[LITERAL_ROW].replace("128", "256")

    nvim.input("3<Plug>(skyline-batch-inc)")  # a count: three doublings
    wait_for(lambda: "batch_size=2048" in literal_line(nvim), "the literal to become 2048", timeout=10)
    assert_prediction(nvim, 2048)
    assert hint(nvim).startswith("predicted at 2048: ")
    assert "~" in nvim.exec_lua("return require('skyline').status()")
    nvim.input("2\\-")
    wait_for(lambda: "batch_size=512" in literal_line(nvim), "the literal to become 512", timeout=10)

    nvim.input("u")  # one press, one undo step
    wait_for(lambda: "batch_size=2048" in literal_line(nvim), "undo to 2048", timeout=10)
    nvim.input("u")
    wait_for(lambda: "batch_size=256" in literal_line(nvim), "undo to 256", timeout=10)
    wait_for(lambda: state(nvim)["batch_size"] == 256, "the prediction to follow the undo", timeout=10)
    assert_prediction(nvim, 256)
    assert_no_traceback(nvim)


def test_the_reprofile_replaces_the_prediction_with_measurements(profiled):
    nvim = profiled
    nvim.exec_lua("require('skyline.config').get().reprofile_delay_ms = 100")
    done = nvim.vars["skyline_test_done"]
    nvim.input("<Plug>(skyline-batch-dec)")
    wait_for(lambda: "batch_size=64" in literal_line(nvim), "the literal to become 64", timeout=10)
    assert_prediction(nvim, 64)
    wait_for(lambda: nvim.vars["skyline_test_done"] > done, "the re-profile")
    current = state(nvim)
    doc = document(nvim)
    assert doc["batch_size"] == 64  # measured at the unsaved buffer's batch size
    assert current["measured"]["batch_size"] == current["batch_size"] == 64
    assert current["measured"]["samples_per_second"] == doc["iteration"]["samples_per_second"]
    assert current["prediction"]["batch_size"] == 64
    assert current["stale"] is False
    assert hint(nvim).startswith("measured at 64: ")


def test_batch_size_command_forms_and_bad_values(profiled):
    nvim = profiled
    nvim.command("SkylineBatchSize 100")
    assert "batch_size=100" in literal_line(nvim)
    assert_prediction(nvim, 100)
    nvim.command("SkylineBatchSize +28")
    assert "batch_size=128" in literal_line(nvim)
    nvim.command("SkylineBatchSize -64")
    assert "batch_size=64" in literal_line(nvim)
    nvim.command("SkylineBatchSize! max")  # (! : no question, see test_nvim_editor.py)
    models = document(nvim)["models"]
    expected = min(models["max_batch_size"], models["trusted_range"][1])  # not beyond the trusted range
    assert f"batch_size={expected}" in literal_line(nvim)
    assert state(nvim)["prediction"]["fits"] is True

    nvim.command("SkylineBatchSize! 2147483647")  # far beyond the device's memory
    assert state(nvim)["prediction"]["fits"] is False
    wait_for_message(nvim, "batch size 2147483647 is predicted to need")
    assert "(does not fit)" in nvim.exec_lua("return require('skyline').status()")

    nvim.command("SkylineBatchSize 4")
    nvim.exec_lua("require('skyline.config').get().batch_step = 16")  # steps that add, not double
    nvim.input("2<Plug>(skyline-batch-inc)")
    wait_for(lambda: "batch_size=36" in literal_line(nvim), "two steps of 16", timeout=10)
    nvim.input("5<Plug>(skyline-batch-dec)")
    wait_for(lambda: "batch_size=1" in literal_line(nvim), "the smallest batch size", timeout=10)
    nvim.command("SkylineBatchSize 4")
    for bad, message in (
        ("0", "it must be from 1"),
        ("-5", "the batch size would be -1"),
        ("abc", "expected N, +N, -N or max"),
    ):
        nvim.command(f"SkylineBatchSize {bad}")
        wait_for_message(nvim, message)
        assert "batch_size=4" in literal_line(nvim)
    assert_no_traceback(nvim)


def test_a_computed_batch_size_is_left_alone(nvim, project):
    entry = project / "entry_point.py"
    entry.write_text(entry.read_text().replace("batch_size=128", "batch_size=2 ** 7"))
    nvim.exec_lua(FAST_SETUP)
    nvim.command(f"edit {entry}")
    profile(nvim)
    before = nvim.current.buffer[:]
    nvim.input("<Plug>(skyline-batch-inc)")
    wait_for_message(nvim, "the batch_size default `2 ** 7` is not an integer literal")
    nvim.command("SkylineBatchSize max")
    assert nvim.current.buffer[:] == before
    assert nvim.eval("&modified") == 0
    assert_no_traceback(nvim)


def test_the_constant_the_default_names_is_edited(nvim, project):
    # BATCH_SIZE = 128 at the top, read only by the default: the keys edit it, one undo step a press.
    entry = project / "entry_point.py"
    text = entry.read_text().replace("batch_size=128", "batch_size=BATCH_SIZE")
    entry.write_text("BATCH_SIZE = 128  # samples per step\n" + text)
    nvim.exec_lua(FAST_SETUP)
    nvim.command(f"edit {entry}")
    profile(nvim)
    assert document(nvim)["batch_size_location"]["line"] == 1
    nvim.exec_lua("require('skyline.config').get().reprofile_delay_ms = 600000")
    before = nvim.current.buffer[:]
    nvim.input("<Plug>(skyline-batch-inc)")
    wait_for(lambda: nvim.current.buffer[0].startswith("BATCH_SIZE = 256 "), "the constant to become 256", timeout=10)
    assert_prediction(nvim, 256)
    assert nvim.current.buffer[:] == ["BATCH_SIZE = 256  # samples per step", *before[1:]]
    nvim.command("undo")
    assert nvim.current.buffer[:] == before
    assert_no_traceback(nvim)


def test_the_keys_answer_before_the_first_profile_and_move_nothing(nvim, project):
    # They fell through to `+`, which moved the cursor, and said nothing.
    nvim.exec_lua("require('skyline').setup({engine_args = {'--quick'}, device = 'cpu'})")
    nvim.command(f"edit {project}/model.py")  # a helper module: no maps before its project is profiled
    assert nvim.funcs.maparg("\\+", "n") == ""
    nvim.command(f"edit {project}/entry_point.py")
    before, cursor = nvim.current.buffer[:], tuple(nvim.current.window.cursor)
    nvim.input("\\+")
    wait_for_message(nvim, "no results yet: run :SkylineProfile first")
    assert nvim.current.buffer[:] == before and tuple(nvim.current.window.cursor) == cursor
    assert_no_traceback(nvim)


def test_keymaps_can_be_switched_off_and_are_never_global(nvim, project):
    nvim.exec_lua("require('skyline').setup({keymaps = false, engine_args = {'--quick'}, device = 'cpu'})")
    nvim.command(f"edit {project}/entry_point.py")
    profile(nvim)
    assert nvim.funcs.maparg("\\+", "n") == ""
    nvim.exec_lua(
        "require('skyline').setup({keymaps = {batch_inc = '<M-a>', batch_dec = ''},"
        " engine_args = {'--quick'}, device = 'cpu'})"
    )
    nvim.command(f"edit {project}/model.py")
    nvim.command("bwipeout! entry_point.py")
    nvim.command(f"edit {project}/entry_point.py")  # the entry point's buffer, read again
    assert nvim.funcs.maparg("<M-a>", "n") == "<Plug>(skyline-batch-inc)"
    assert nvim.funcs.maparg("\\-", "n") == ""
    nvim.command(f"edit {project}/model.py")  # a file of the project: mapped too
    assert nvim.funcs.maparg("<M-a>", "n") == "<Plug>(skyline-batch-inc)"
    nvim.command("enew")
    assert nvim.funcs.maparg("<M-a>", "n") == ""  # buffer-local


def test_the_literal_is_edited_where_the_analysis_located_it(nvim, project):
    # In parentheses, the literal is beyond what the editor's text scan finds; the engine's
    # location of it is used while the buffer is as analysed, and after the plugin's own writes.
    entry = project / "entry_point.py"
    entry.write_text(entry.read_text().replace("batch_size=128", "batch_size=(128)"))
    nvim.exec_lua(FAST_SETUP)
    nvim.command(f"edit {entry}")
    profile(nvim)
    nvim.exec_lua("require('skyline.config').get().reprofile_delay_ms = 600000")
    others = nvim.current.buffer[:]
    nvim.input("<Plug>(skyline-batch-inc)")
    wait_for(lambda: "batch_size=(256)" in literal_line(nvim), "the literal to become 256", timeout=10)
    nvim.input("<Plug>(skyline-batch-inc)")
    wait_for(lambda: "batch_size=(512)" in literal_line(nvim), "the literal to become 512", timeout=10)
    assert_prediction(nvim, 512)
    after = nvim.current.buffer[:]
    assert after[LITERAL_ROW] == others[LITERAL_ROW].replace("(128)", "(512)")
    assert after[:LITERAL_ROW] + after[LITERAL_ROW + 1 :] == others[:LITERAL_ROW] + others[LITERAL_ROW + 1 :]

    # Edited by hand: the literal is looked for in the text again, which does not see this one.
    nvim.current.buffer.append("# a note", 0)
    nvim.input("<Plug>(skyline-batch-inc)")
    wait_for_message(nvim, "the batch_size default `(512` is not an integer literal")
    assert nvim.current.buffer[LITERAL_ROW + 1] == after[LITERAL_ROW]
    assert_no_traceback(nvim)


def test_an_unsaved_literal_is_never_edited_at_the_files_columns(nvim, project):
    # The file says 12, the buffer 128: the engine's columns of `12` lie inside `128`.
    entry = project / "entry_point.py"
    entry.write_text(entry.read_text().replace("batch_size=128", "batch_size=12"))
    nvim.exec_lua(FAST_SETUP)
    nvim.command(f"edit {entry}")
    nvim.current.buffer[LITERAL_ROW] = literal_line(nvim).replace("batch_size=12", "batch_size=128")
    profile(nvim)
    assert document(nvim)["batch_size_location"]["value"] == 12
    nvim.exec_lua("require('skyline.config').get().reprofile_delay_ms = 600000")
    nvim.input("<Plug>(skyline-batch-inc)")
    wait_for(lambda: "batch_size=256" in literal_line(nvim), "the literal to become 256", timeout=10)
    assert literal_line(nvim) == "def skyline_input_provider(batch_size=256):"
    assert_prediction(nvim, 256)
    assert_no_traceback(nvim)


def chart(nvim) -> dict:
    """{batch size: its row of the breakdown's chart}."""
    lines = nvim.current.buffer[:]
    header = next(i for i, line in enumerate(lines) if line.startswith("Batch size"))
    rows = lines[header + 1 : lines.index("", header)]
    return {int(row[2:12].replace(",", "")): row for row in rows}


def rounded(value: float | None) -> str:
    """The chart's throughput: no throughput where the predicted run time is not positive."""
    return "—" if value is None else f"{math.floor(value + 0.5):,}"


def test_the_chart_draws_the_documents_rows_and_the_current_batch_size(profiled):
    nvim = profiled
    doc = document(nvim)
    nvim.command("SkylineBreakdown")
    rows = chart(nvim)
    assert sorted(rows) == [p["batch_size"] for p in doc["predictions"]]
    measured = [p for p in doc["predictions"] if p.get("measured")]
    assert {p["batch_size"] for p in measured} >= {64, 128, 256}  # the user's, half and twice it
    for p in doc["predictions"]:
        row = rows[p["batch_size"]]
        shown = p.get("measured") or p  # a measured row shows the measurement, not the line through it
        assert f" {rounded(shown.get('samples_per_second'))} " in row, row
        assert f" {format_bytes(shown['peak_memory_bytes'])}" in row, row
        assert ("measured" in row) == bool(p.get("measured")), row
        assert ("extrapolated" in row) == (p["extrapolated"] and not p.get("measured")), row
        # Why the row is there, as the terminal report's table says it.
        assert ("largest fit" in row) == (p["batch_size"] == doc["models"]["max_batch_size"]), row
        assert row.startswith("▸") == (p["batch_size"] == 128), row
    assert doc["models"]["max_batch_size"] in rows  # the ladder ends with it: the test saw the note
    nvim.command("SkylineBreakdown")

    nvim.command("SkylineBatchSize 100")  # no row of the document: one predicted
    nvim.command("SkylineBreakdown")
    rows = chart(nvim)
    expected = predict(doc["models"], 100)
    assert rows[100].startswith("▸")
    assert f" {rounded(expected.get('samples_per_second'))} " in rows[100]
    assert f" {format_bytes(expected['peak_memory_bytes'])}" in rows[100]
    assert "measured" not in rows[100]
    assert not rows[128].startswith("▸")
    assert sorted(rows) == sorted([p["batch_size"] for p in doc["predictions"]] + [100])
    assert_no_traceback(nvim)
