"""The editor's second pass (issue 11), in a real Neovim: the float laid out for the window, its
memory section, one figure per batch size and nothing negative; one message when a profile ends;
errors in one line with the full text in a diagnostic over the statement; costs with what a line
calls; batch-size keys in every project file, with dot-repeat; `max` within the trusted range and
a question before a batch size that could fill the machine; :SkylineToggle; priorities.

Most tests show a real analysis document of the default example (made once by `skyline profile
--json`) with the numbers they need written into it, through `profile.show()`, the path a saved
report takes: what they check does not depend on how busy the machine is.
"""

from __future__ import annotations

import copy
import itertools
import json
import re
import shutil

import pytest

from conftest import run_skyline
from nvim_helpers import EXAMPLE, annotations, as_lua_receives, assert_no_traceback, state, wait_for, wait_for_message


def example_row(name: str, text: str) -> int:
    """The 0-based row of the one line of examples/default/`name` that holds `text`: found by its
    text, so that an edit of the example moves no test."""
    rows = [i for i, line in enumerate((EXAMPLE / name).read_text().splitlines()) if text in line]
    assert len(rows) == 1, f"{name} should hold {text!r} on one line, not on rows {rows}"
    return rows[0]


ENTRY_LITERAL_ROW = example_row("entry_point.py", "def skyline_input_provider(batch_size=")
MODEL_CALL_ROW = example_row("entry_point.py", "loss = model(features, labels)")
STEP_ROW = example_row("entry_point.py", "optimizer.step()")
BODY = "hidden = self.body(features)"
BODY_ROW = example_row("model.py", BODY)  # a line of model.py with costs of its own
NO_REPROFILE = "require('skyline').setup({reprofile_delay_ms = 600000, profile_on_save = false})"


@pytest.fixture(scope="session")
def real_document(tmp_path_factory) -> dict:
    """One real analysis document of the default example."""
    root = tmp_path_factory.mktemp("document") / "project"
    shutil.copytree(EXAMPLE, root, ignore=shutil.ignore_patterns("__pycache__"))
    out = root.parent / "document.json"
    result = run_skyline("profile", "entry_point.py", "--device", "cpu", "--quiet", "--json", out, cwd=root)
    assert result.returncode == 0, result.stderr
    return json.loads(out.read_text())


# Fixed models: time 2 ms + 0.05 ms/sample, memory 1 MiB + 4 KiB/sample, measured 64-4096,
# 16 GiB usable (the largest batch size that fits: 4,194,048).
MODELS = {
    "run_time_ms": {"slope": 0.05, "bias": 2.0, "r2": 0.999},
    "peak_memory_bytes": {"slope": 4096.0, "bias": 1048576.0, "r2": 1.0},
    "trusted_range": [64, 4096],
    "usable_memory_bytes": 16 * 2**30,
    "max_batch_size": 4194048,
    # Nothing timed after the models, no range cut, nothing recommended (the real analysis's would
    # not match these models): the tests that need a recommendation write one.
    "checks": [],
    "line_bends_at": None,
    "range_unprobed": False,
    "recommendation": {"batch_size": None, "measured": False, "reason": "no reason given"},
}


def fixed_document(real: dict, project, **changes) -> dict:
    """The real document moved to `project`, with fixed numbers where tests read them."""
    doc = copy.deepcopy(real)
    doc["project_root"] = str(project)
    doc["device"].update(type="cpu", name="Test CPU", memory_capacity_bytes=16 * 2**30)
    doc["iteration"].update(samples_per_second=2404.2, peak_memory_bytes=11429478, run_time_ms=53.24)
    doc["iteration"]["peak_memory_phase"] = "optimizer"
    # What an operation's time is: the machine's load decides it for the real analysis (a busy CPU
    # times them by their thread's CPU time, and the tree's title says so).
    doc["attribution"]["device_time"] = None
    doc["warnings"] = []
    doc["models"] = dict(
        copy.deepcopy(MODELS), **{k: v for k, v in (doc.get("models") or {}).items() if k not in MODELS}
    )
    doc.update(changes)
    return doc


def show(nvim, doc: dict) -> None:
    nvim.exec_lua("require('skyline.profile').show(...)", as_lua_receives(doc))


def label_width(nvim) -> int:
    """The float's section labels' width: the lines beneath a label start with as many spaces."""
    return nvim.exec_lua("return require('skyline.float.layout').LABEL")


def beneath(nvim, lines: list[str], start: int) -> str:
    """The text beneath the label of the section that starts at `start`, as one line: the float
    wraps it to its width."""
    indent = " " * label_width(nvim)
    following = itertools.takewhile(lambda line: line.startswith(indent), lines[start + 1 :])
    return " ".join(line.strip() for line in following)


def float_lines(nvim) -> list[str]:
    nvim.command("SkylineBreakdown")
    lines = nvim.current.buffer[:]
    width = nvim.api.win_get_width(0)
    nvim.command("SkylineBreakdown")
    return lines, width


@pytest.fixture
def editor(nvim, project):
    nvim.exec_lua(NO_REPROFILE)
    nvim.command(f"edit {project}/entry_point.py")
    return nvim


def test_the_float_fits_the_window_and_always_shows_file_and_line(editor, project, real_document):
    nvim = editor
    doc = fixed_document(real_document, project)
    deep = "a_rather_long_package_name/with/several/nested/folders/inside/the/project/"

    def move(node):  # every place far down the tree of folders
        for context in node.get("contexts", []):
            context["path"] = deep + context["path"]
        for child in node.get("children", []):
            move(child)

    move(doc["operations"])
    # The longest note a chart row has: the largest fit, extrapolated (as on a busy machine, where
    # fewer memory probes fit the time budget).
    largest = max(doc["predictions"], key=lambda p: p["batch_size"])
    largest.update(extrapolated=True, measured=None)
    doc["models"]["max_batch_size"] = largest["batch_size"]
    # The longest lines beneath a label: a knee beyond the trusted range with wide numbers (a real
    # analysis's vary with the machine's load) and a peak at a line far down the project.
    doc["models"].update(
        throughput_knee_batch_size=123_456,
        throughput_knee_samples_per_second=1_234_567.0,
        asymptotic_samples_per_second=1_371_741.0,
    )
    doc["iteration"]["peak_memory_phase"] = "forward_backward"
    peak = {"operation": "native_batch_norm_backward", "phase": "backward", "path": deep + "model.py", "line": 19}
    doc["peak_memory_operation"] = peak
    doc["iteration"]["micro_batches"] = 16  # the throughput's line with its micro-batches
    doc["compilation"] = {
        "graphs": 12,
        "seconds": 123.4,
        "batch_sizes": [{"batch_size": 128, "graphs": 12, "seconds": 123.4}],
    }
    doc["attribution"]["mode"] = "eager_replay"
    show(nvim, doc)
    for columns in (160, 100, 80):
        nvim.options["columns"] = columns
        nvim.command("doautocmd VimResized")
        lines, width = float_lines(nvim)
        assert width <= columns - 4
        too_wide = [line for line in lines if nvim.funcs.strdisplaywidth(line) > width]
        assert not too_wide, (width, too_wide)
        text = " ".join(line.strip() for line in lines)  # wrapped, not cut
        assert "knee: 1,234,567 samples/s at batch size 123,456 (90% of 1,371,741 samples/s), an extrapolation" in text
        assert "measured at batch size 128 × 16 micro-batches per optimizer step" in text
        assert "torch.compile: 12 graph(s) in 123.4 s, not in the iteration's time" in text
        memory = next(i for i, line in enumerate(lines) if line.startswith("Memory"))
        peak = re.fullmatch(
            r"peak reached in .*, at (\S+) \(native_batch_norm_backward, backward\)", beneath(nvim, lines, memory)
        )
        assert peak, beneath(nvim, lines, memory)
        assert peak[1] == deep + "model.py:19" or ("…" in peak[1] and peak[1].endswith("/model.py:19")), peak[1]
        tree = lines[next(i for i, line in enumerate(lines) if line.startswith("Operations")) + 1 :]
        places = [re.search(r"\S*model\.py:\d+", row).group() for row in tree if "model.py" in row]
        assert places and all(p == deep + p.split("/")[-1] or "…" in p for p in places), places
        assert any(row.strip().startswith("body") and f"model.py:{BODY_ROW + 1}" in row for row in tree), tree
    assert_no_traceback(nvim)


def test_a_deep_tree_keeps_its_names_whole_at_80_columns(editor, project, real_document):
    # A library's model nests modules six levels deep (GPT-2's model.transformer.h.0.attn.c_attn,
    # then its addmm): two cells a level left `c_…` and `…` of their names at 80 columns.
    nvim = editor
    doc = fixed_document(real_document, project)
    names = ["model", "transformer", "h", "0", "attn", "c_attn", "addmm"]
    place = [{"path": "entry_point.py", "line": 22}]
    leaf = {"name": names[-1], "kind": "operation", "module": "", "forward_ms": 1.0, "backward_ms": 1.0}
    node = dict(leaf, activation_bytes=0, contexts=place, children=[])
    for name in reversed(names[:-1]):
        node = dict(node, name=name, kind="module", children=[node])
    doc["operations"]["children"] = [node, *doc["operations"]["children"]]
    show(nvim, doc)
    nvim.options["columns"] = 80
    nvim.command("doautocmd VimResized")
    lines, width = float_lines(nvim)
    tree = lines[next(i for i, line in enumerate(lines) if line.startswith("Operations")) + 1 :]
    shown = [row.split()[0] for row in tree[1 : 1 + len(names)]]
    assert shown == names, tree[: 1 + len(names)]
    depths = [len(row) - len(row.lstrip()) for row in tree[1 : 1 + len(names)]]
    assert depths == sorted(depths) and len(set(depths)) == len(names)  # still a tree, a level a step
    assert all(nvim.funcs.strdisplaywidth(row) <= width for row in tree)


def test_the_update_has_its_own_column_in_the_tree_where_the_iteration_has_one(editor, project, real_document):
    # The default example's Adam: its operations at `optimizer.step()` were forward time.
    nvim = editor
    doc = fixed_document(real_document, project)
    step_line = next(e["line"] for e in doc["lines"] if e["step_ms"] > 0)
    show(nvim, doc)
    nvim.options["columns"] = 80
    lines, width = float_lines(nvim)
    start = next(i for i, line in enumerate(lines) if line.startswith("Operations"))
    assert lines[start].split() == ["Operations", "forward", "backward", "step"]
    tree = [row for row in lines[start + 1 :] if re.search(r"\d ms", row)]
    times = {row.split()[0]: re.findall(r"(\d+\.\d+) ms", row) for row in tree}
    # The file name and line whole at 80 columns: the tree's bars give way to them.
    updates = [row for row in tree if re.search(rf" entry_point\.py:{step_line}\b", row)]
    assert updates and all(re.findall(r"(\d+\.\d+) ms", row)[:2] == ["0.00", "0.00"] for row in updates)
    assert all(len(re.findall(r" ms", row)) == 3 for row in updates)  # forward, backward, step
    assert len(times["iteration"]) == 3 and float(times["iteration"][2]) > 0
    others = [row for row in tree if row not in updates and row.split()[0] not in ("iteration", "untracked")]
    assert others and all(len(re.findall(r" ms", row)) == 2 for row in others)  # no step: blank
    assert all(nvim.funcs.strdisplaywidth(row) <= width for row in lines)

    # An iteration that updates nothing (inference) keeps two columns.
    def no_step(node):
        node["step_ms"] = 0.0
        for child in node["children"]:
            no_step(child)

    no_step(doc["operations"])
    show(nvim, doc)
    lines, _ = float_lines(nvim)
    assert next(line for line in lines if line.startswith("Operations")).split() == [
        "Operations",
        "forward",
        "backward",
    ]
    # On a GPU the title says what an operation's time is (attribution.device_time).
    doc["attribution"]["device_time"] = "kernels"
    show(nvim, doc)
    lines, _ = float_lines(nvim)
    assert next(line for line in lines if line.startswith("Operations")).split()[:4] == [
        "Operations",
        "(GPU",
        "kernel",
        "time)",
    ]
    # On a busy CPU, that each is its thread's CPU time.
    doc["attribution"]["device_time"] = "thread_cpu"
    show(nvim, doc)
    lines, _ = float_lines(nvim)
    title = next(line for line in lines if line.startswith("Operations"))
    assert title.startswith("Operations (CPU time, CPU busy)") and title.split()[-2:] == ["forward", "backward"]
    assert_no_traceback(nvim)


def test_the_tree_ends_with_the_untracked_time_and_its_rows_add_up_to_the_iteration(editor, project, real_document):
    # The operations took 34 ms of a 53.24 ms iteration: the model's forward and backward, then
    # the optimizer's step at the root; the rest passed between operations.
    nvim = editor
    doc = fixed_document(real_document, project)
    assert doc["iteration"]["run_time_ms"] == 53.24

    def node(name, kind, children=(), forward=0.0, backward=0.0, step=0.0, line=STEP_ROW + 1):
        return {
            "name": name,
            "kind": kind,
            "module": "",
            "forward_ms": forward,
            "backward_ms": backward,
            "step_ms": step,
            "activation_bytes": 0,
            "contexts": [{"path": "entry_point.py", "line": line}],
            "children": list(children),
        }

    addmm = node("addmm", "operation", forward=20.0, backward=10.0, line=MODEL_CALL_ROW + 1)
    model = node("model", "module", [addmm], forward=20.0, backward=10.0, line=MODEL_CALL_ROW + 1)
    step = node("_foreach_add_", "operation", step=4.0)
    doc["operations"] = node("iteration", "module", [model, step], forward=20.0, backward=10.0, step=4.0)
    show(nvim, doc)
    for columns in (80, 160):
        nvim.options["columns"] = columns
        nvim.command("doautocmd VimResized")
        lines, width = float_lines(nvim)
        start = next(i for i, line in enumerate(lines) if line.startswith("Operations"))
        tree = [row for row in lines[start + 1 :] if row.strip()]
        assert [row.split()[0] for row in tree] == ["iteration", "model", "addmm", "_foreach_add_", "untracked"]
        untracked = tree[-1]
        assert "between operations" in untracked and untracked.rstrip().endswith(" 19.24 ms"), untracked
        # The rows beneath the iteration's own, one level down, add up to the iteration.
        depth = min(len(row) - len(row.lstrip()) for row in tree[1:])
        parts = [row for row in tree[1:] if len(row) - len(row.lstrip()) == depth]
        assert [row.split()[0] for row in parts] == ["model", "_foreach_add_", "untracked"]
        times = [float(ms) for row in parts for ms in re.findall(r"(\d+\.\d+) ms", row)]
        assert sum(times) == pytest.approx(53.24, abs=0.005 * len(times))
        assert untracked.startswith(" " * depth + "untracked")
        assert all(nvim.funcs.strdisplaywidth(row) <= width for row in tree)
    # At 160 columns the bars stand against the iteration: the untracked 19.24 ms of 53.24 fill
    # 4 of the 12 cells, the forward pass's 20 ms 5.
    assert "████░░░░░░░░ 19.24 ms" in untracked
    assert "█████░░░░░░░ 20.00 ms" in tree[0]
    assert_no_traceback(nvim)


def test_an_open_float_is_laid_out_again_when_the_editor_is_resized(editor, project, real_document):
    nvim = editor
    show(nvim, fixed_document(real_document, project))
    nvim.options["columns"] = 160
    nvim.command("SkylineBreakdown")
    window = nvim.current.window
    wide = nvim.api.win_get_width(window)
    nvim.options["columns"] = 70
    nvim.command("doautocmd VimResized")
    assert nvim.api.win_get_width(window) <= 66 < wide
    config = nvim.api.win_get_config(window)
    assert config["col"] + nvim.api.win_get_width(window) <= 70
    assert_no_traceback(nvim)


def test_warnings_wrap_at_word_boundaries(editor, project, real_document):
    nvim = editor
    nvim.options["columns"] = 90
    warning = (
        "the run time did not grow in a straight line with the batch size (R² 0.71): the machine was "
        "probably busy; profile again on a quiet machine before trusting the predicted throughput"
    )
    show(nvim, fixed_document(real_document, project, warnings=[warning]))
    lines, width = float_lines(nvim)
    start = next(i for i, line in enumerate(lines) if line.startswith("! "))
    wrapped = lines[start : start + 4]
    assert len([line for line in wrapped if line.startswith(("! ", "  "))]) >= 2
    assert " ".join(line[2:].strip() for line in wrapped if line.startswith(("! ", "  "))).startswith(warning[:150])
    assert all(len(line) <= width for line in wrapped)
    words = set(warning.split())
    for line in wrapped[:2]:
        assert set(line[2:].split()) <= words, line  # no word cut in two


def test_one_figure_per_batch_size_and_nothing_negative(editor, project, real_document):
    nvim = editor
    measured_128 = {
        "batch_size": 128,
        "run_time_ms": 53.24,
        "samples_per_second": 2404.2,
        "peak_memory_bytes": 11429478,
    }
    predictions = [
        {"batch_size": 64, "run_time_ms": -4.0, "samples_per_second": -16000.0, "peak_memory_bytes": 5 * 2**20},
        {"batch_size": 128, "samples_per_second": 2007.0, "peak_memory_bytes": 11 * 2**20, "measured": measured_128},
        {"batch_size": 1024, "samples_per_second": 3100.0, "peak_memory_bytes": 40 * 2**20},
    ]
    for p in predictions:
        p.setdefault("run_time_ms", 1.0)
        p.update(fits=True, extrapolated=False)
    models = dict(MODELS, asymptotic_samples_per_second=2209.0, throughput_knee_batch_size=96)
    show(nvim, fixed_document(real_document, project, predictions=predictions, models=models))
    lines, _ = float_lines(nvim)
    text = "\n".join(lines)
    assert "2,404 samples/s measured at batch size 128" in lines[0]
    assert "2,007" not in text  # the line through the measurement is not shown beside it
    assert "knee" not in text  # a limit of 2,209 below a measured 2,404 contradicts it
    header = next(i for i, line in enumerate(lines) if line.startswith("Batch size"))
    rows = {int(row[2:12].replace(",", "")): row for row in lines[header + 1 : lines.index("", header)]}
    assert "2,404" in rows[128] and "measured" in rows[128]
    assert " — " in rows[64] and "16,000" not in rows[64]
    assert not re.search(r"-\d", text), text
    assert_no_traceback(nvim)


def batch_hint(nvim) -> str:
    """The hint at the entry point's batch-size literal."""
    marks = nvim.api.buf_get_extmarks(0, nvim.api.create_namespace("skyline.batch"), 0, -1, {"details": True})
    assert [mark[1] for mark in marks] == [ENTRY_LITERAL_ROW]
    return marks[0][3]["virt_text"][0][0]


def labelled(nvim, lines: list[str], label: str) -> str:
    """The text beside `label` and beneath it, as one line (the float wraps it to its width)."""
    start = next(i for i, line in enumerate(lines) if line.startswith(label + " "))
    return " ".join([lines[start][label_width(nvim) :].strip(), beneath(nvim, lines, start)]).strip()


ADVICE = {
    "batch_size": 512,
    "samples_per_second": 3022.0,
    "measured": True,
    "reason": "it reaches 90% of the 3,300 samples/s this model approaches: larger batch sizes buy little speed for "
    "their memory",
    "users_samples_per_second": 2404.2,
}


def test_the_documents_recommendation_is_what_the_float_the_statusline_and_the_keys_show(
    editor, project, real_document
):
    nvim = editor
    doc = fixed_document(real_document, project)
    doc["models"]["recommendation"] = ADVICE
    show(nvim, doc)
    lines, _ = float_lines(nvim)
    assert labelled(nvim, lines, "Advice") == (
        "use 512 for 3,022 samples/s (measured), 26% faster than yours (128) timed beside it " + ADVICE["reason"]
    )
    header = next(i for i, line in enumerate(lines) if line.startswith("Batch size"))
    rows = {int(row[2:12].replace(",", "")): row for row in lines[header + 1 : lines.index("", header)]}
    assert [b for b, row in rows.items() if "recommended" in row] == [512]
    status = nvim.exec_lua("return require('skyline').status()")
    assert status.endswith(" · use 512 (+26%)")
    assert batch_hint(nvim).endswith(" · use 512 (+26%)")  # at the analysed batch size, what to use instead
    # The keys and :SkylineBatchSize say where a change goes.
    nvim.command("SkylineBatchSize 256")
    assert batch_hint(nvim).endswith(" · towards 512, the recommended")
    nvim.command("SkylineBatchSize 64")
    assert batch_hint(nvim).endswith(" · away from 512, the recommended")
    nvim.command("SkylineBatchSize 512")
    assert batch_hint(nvim).endswith(" · recommended")
    assert " · recommended" in nvim.exec_lua("return require('skyline').status()")
    assert_no_traceback(nvim)


def test_no_recommendation_says_why_and_the_statusline_says_nothing_of_it(editor, project, real_document):
    nvim = editor
    doc = fixed_document(real_document, project)
    reason = (
        "512, which the models suggest, ran only 4% faster than yours (128) timed beside it: a change must be at "
        "least 10% faster to clear the noise"
    )
    doc["models"]["recommendation"] = {"batch_size": None, "measured": False, "reason": reason}
    show(nvim, doc)
    lines, _ = float_lines(nvim)
    assert labelled(nvim, lines, "Advice") == "none to recommend " + reason
    assert "use " not in nvim.exec_lua("return require('skyline').status()")
    assert "recommended" not in batch_hint(nvim)
    assert_no_traceback(nvim)


def test_accumulated_micro_batches_show_beside_the_throughput(editor, project, real_document):
    nvim = editor
    doc = fixed_document(real_document, project)
    show(nvim, doc)
    lines, _ = float_lines(nvim)
    assert "micro-batches" not in lines[0]
    doc["iteration"]["micro_batches"] = 4
    show(nvim, doc)
    lines, _ = float_lines(nvim)
    throughput = f"{lines[0].rstrip()} {beneath(nvim, lines, 0)}"  # wrapped to the float's width
    assert "measured at batch size 128 × 4 micro-batches per optimizer step" in throughput, lines
    assert_no_traceback(nvim)


def test_a_compiled_model_says_what_was_compiled_and_where_the_lines_come_from(editor, project, real_document):
    nvim = editor
    doc = fixed_document(real_document, project)
    show(nvim, doc)
    lines, _ = float_lines(nvim)
    assert not any(line.startswith("Compiled") for line in lines)  # an eager model
    doc["compilation"] = {
        "graphs": 3,
        "seconds": 2.43,
        "batch_sizes": [
            {"batch_size": 128, "graphs": 1, "seconds": 2.2},
            {"batch_size": 64, "graphs": 2, "seconds": 0.23},
        ],
    }
    doc["attribution"]["mode"] = "eager_replay"
    show(nvim, doc)
    lines, _ = float_lines(nvim)
    start = next(i for i, line in enumerate(lines) if line.startswith("Compiled"))
    section = f"{lines[start].split(None, 1)[1].rstrip()} {beneath(nvim, lines, start)}"  # wrapped to the float's width
    assert section == (
        "torch.compile: 3 graph(s) in 2.4 s, not in the iteration's time "
        "per-line times from an eager run of the iteration"
    )
    assert_no_traceback(nvim)


def memory_parts(nvim, lines: list[str]) -> list[str]:
    """The memory section's rows beneath the lines that follow its label: its parts."""
    start = next(i for i, line in enumerate(lines) if line.startswith("Memory"))
    return [line for line in lines[start + 1 :] if not line.startswith(" " * label_width(nvim))][:5]


def test_the_memory_section_shows_each_part_against_the_capacity(editor, project, real_document):
    # What is alive at a peak of 11,429,478 bytes inside the optimizer step: the parts add up to it.
    nvim = editor
    doc = fixed_document(real_document, project)
    doc["peak_memory_parts"] = {
        "weights_bytes": 2 * 2**20,
        "gradients_bytes": 2 * 2**20,
        "optimizer_state_bytes": 4 * 2**20,
        "activations_bytes": 0,  # backward freed them before the step
        "other_bytes": 11429478 - 8 * 2**20,  # 2.9 MiB: the step's temporaries
    }
    doc["untracked"]["memory_bytes"] = doc["peak_memory_parts"]["other_bytes"]
    doc["peak_memory_operation"] = {"operation": "_foreach_add_", "phase": "optimizer", "path": "train.py", "line": 7}
    show(nvim, doc)
    lines, _ = float_lines(nvim)
    start = next(i for i, line in enumerate(lines) if line.startswith("Memory"))
    assert "10.9 MiB of 16.0 GiB (cpu, Test CPU)" in lines[start]
    assert beneath(nvim, lines, start) == "peak reached in the optimizer step, at train.py:7 (_foreach_add_)"
    expected = [("weights", "2.0 MiB"), ("gradients", "2.0 MiB"), ("optimizer", "4.0 MiB")]
    expected += [("activations", "0 B"), ("other", "2.9 MiB")]
    parts = memory_parts(nvim, lines)
    assert len(parts) == len(expected)
    for line, (part, size) in zip(parts, expected):
        assert line.strip().startswith(part) and line.rstrip().endswith(" " + size), line
        assert "░" in line  # a bar against the capacity
    assert not any("reserved" in line or "cuBLAS" in line for line in lines)  # a CPU document
    doc["iteration"]["peak_memory_reserved_bytes"] = 16 * 2**20  # as a CUDA document has them
    doc["untracked"]["workspace_bytes"] = 256
    show(nvim, doc)
    lines, _ = float_lines(nvim)
    start = next(i for i, line in enumerate(lines) if line.startswith("Memory"))
    assert beneath(nvim, lines, start).endswith(" the allocator reserved 16.0 MiB")
    other = next(i for i, line in enumerate(lines) if line.strip().startswith("other "))
    assert lines[other + 1].strip() == "256 B of it cuBLAS workspaces"
    # A document written before the parts: every weight, gradient, state and activation, and the rest.
    del doc["peak_memory_parts"]
    doc["weights"] = [{"name": "model.w", "size_bytes": 2**20, "grad_size_bytes": 2**20, "contexts": []}]
    doc["optimizer_state"] = [{"name": "Adam", "size_bytes": 2 * 2**20, "contexts": []}]
    doc["operations"]["activation_bytes"] = 3 * 2**20
    doc["untracked"]["memory_bytes"] = 512
    show(nvim, doc)
    lines, _ = float_lines(nvim)
    shown = [" ".join(line.split()[-2:]) for line in memory_parts(nvim, lines)]
    assert shown == ["1.0 MiB", "1.0 MiB", "2.0 MiB", "3.0 MiB", "512 B"]
    assert_no_traceback(nvim)


def test_the_memory_peak_is_named_by_the_passes_that_ran(editor, project, real_document):
    nvim = editor
    doc = fixed_document(real_document, project)
    doc["iteration"]["peak_memory_phase"] = "forward_backward"
    doc["peak_memory_operation"] = {"operation": "addmm", "phase": "forward", "path": "train.py", "line": 5}
    assert doc["operations"]["backward_ms"] > 0  # a training iteration
    for backward_ms, named in (
        (doc["operations"]["backward_ms"], "the forward and backward pass"),
        (0.0, "the forward pass"),
    ):
        doc["operations"]["backward_ms"] = backward_ms  # 0: inference, whose recording has no backward work
        show(nvim, doc)
        lines, _ = float_lines(nvim)
        start = next(i for i, line in enumerate(lines) if line.startswith("Memory"))
        assert beneath(nvim, lines, start) == f"peak reached in {named}, at train.py:5 (addmm)"
    assert_no_traceback(nvim)
    assert_no_traceback(nvim)


def test_the_other_tensors_alive_at_the_peak_are_named_beneath_it(editor, project, real_document):
    nvim = editor
    doc = fixed_document(real_document, project)
    doc["iteration"].update(peak_memory_phase="forward_backward", peak_memory_bytes=16 * 2**20)
    doc["peak_memory_operation"] = {
        "operation": "_log_softmax_backward_data",
        "phase": "backward",
        "path": "train.py",
        "line": 7,
        "other_tensors": [
            {"path": "train.py", "line": 7, "phase": "backward", "bytes": 4 * 2**20},  # gradients flowing back
            {"path": "model.py", "line": 19, "phase": "forward", "bytes": 2 * 2**20},  # logits the code holds
            {"path": "train.py", "line": 9, "phase": "optimizer", "bytes": 2**19},  # 3% of the peak: left out
        ],
    }
    show(nvim, doc)
    lines, _ = float_lines(nvim)
    start = next(i for i, line in enumerate(lines) if line.startswith("Memory"))
    assert beneath(nvim, lines, start) == (
        "peak reached in the forward and backward pass, at train.py:7 (_log_softmax_backward_data, backward) "
        "other tensors alive there from train.py:7: 4.0 MiB made in backward; from model.py:19: 2.0 MiB of "
        "forward outputs"
    )
    assert_no_traceback(nvim)


def test_lines_whose_tensors_are_kept_for_good_get_a_warning_over_their_statement(editor, project, real_document):
    nvim = editor
    growth = {
        "bytes_per_iteration": 3 * 2**20,
        "lines": [
            {"path": "model.py", "line": BODY_ROW + 1, "bytes": 2 * 2**20},
            {"path": "entry_point.py", "line": MODEL_CALL_ROW + 1, "bytes": 2**20},
            {"path": None, "line": None, "bytes": 512},  # no line of the project: nowhere to show it
        ],
    }
    show(nvim, fixed_document(real_document, project, memory_growth=growth))
    get = "return vim.diagnostic.get(vim.fn.bufadd(...), {namespace = require('skyline.diagnostics').ns})"
    model = nvim.exec_lua(get, str(project / "model.py"))
    entry = nvim.exec_lua(get, str(project / "entry_point.py"))
    assert [(d["lnum"], d["severity"]) for d in model] == [(BODY_ROW, 2)]  # vim.diagnostic.severity.WARN
    assert model[0]["message"] == (
        "tensors made here stay alive after every iteration: 2.0 MiB of the 3.0 MiB by which memory grows each "
        "iteration (keep no tensors across iterations: `loss.item()`, `output.detach()`)"
    )
    statement = (project / "model.py").read_text().splitlines()[BODY_ROW]  # over the statement, not its indent
    assert (model[0]["col"], model[0]["end_col"]) == (statement.index(BODY), len(statement))
    assert [(d["lnum"], d["message"].split(":")[1].strip()) for d in entry] == [
        (
            MODEL_CALL_ROW,
            "1.0 MiB of the 3.0 MiB by which memory grows each iteration (keep no tensors across iterations",
        )
    ]
    # The next results, without growth, take the warnings away.
    show(nvim, fixed_document(real_document, project))
    assert nvim.exec_lua(get, str(project / "model.py")) == []
    assert_no_traceback(nvim)


def test_a_finished_profile_says_so_in_one_message(editor, project, real_document):
    nvim = editor
    show(nvim, fixed_document(real_document, project))
    wait_for_message(nvim, "skyline: 2,404 samples/s at batch size 128 · 10.9 MiB peak")
    assert state(nvim)["running"] is False


def test_costs_include_what_a_line_calls_and_the_step_is_the_step(editor, project, real_document):
    nvim = editor
    doc = fixed_document(real_document, project)
    lines = [line for line in doc["lines"] if line["path"] != "entry_point.py"]
    for line in lines:
        line.update(forward_ms=1.0, backward_ms=2.0, step_ms=0.0, memory_bytes=0)
        line["inclusive"] = {"forward_ms": 1.0, "backward_ms": 2.0, "step_ms": 0.0}
    caller = {"path": "entry_point.py", "line": MODEL_CALL_ROW + 1, "forward_ms": 0.0, "backward_ms": 0.0}
    caller.update(step_ms=0.0, memory_bytes=0, invocations=1)
    caller["inclusive"] = {"forward_ms": 30.0, "backward_ms": 15.5, "step_ms": 0.0}
    step = {"path": "entry_point.py", "line": STEP_ROW + 1, "forward_ms": 0.0, "backward_ms": 0.0}
    step.update(step_ms=0.1, memory_bytes=0, invocations=1)
    step["inclusive"] = {"forward_ms": 0.0, "backward_ms": 0.0, "step_ms": 0.1}
    doc["lines"] = [*lines, caller, step]
    show(nvim, doc)
    buf = nvim.current.buffer
    marks = annotations(nvim, buf)
    assert marks[MODEL_CALL_ROW][0] == "with calls 45.50 ms (85.5%)"
    assert marks[STEP_ROW][0].startswith("step 0.10 ms · 0.2%")
    assert "fwd" not in marks[STEP_ROW][0]

    nvim.exec_lua("require('skyline').setup({costs = 'self', reprofile_delay_ms = 600000})")
    show(nvim, doc)
    marks = annotations(nvim, buf)
    assert MODEL_CALL_ROW not in marks  # nothing of its own
    nvim.exec_lua("require('skyline').setup({costs = 'inclusive', reprofile_delay_ms = 600000})")
    show(nvim, doc)
    assert annotations(nvim, buf)[MODEL_CALL_ROW][0] == "total 45.50 ms · 85.5%"
    assert_no_traceback(nvim)


def test_an_edited_line_loses_its_costs_and_the_rest_are_dimmed(editor, project, real_document):
    nvim = editor
    nvim.command(f"edit {project}/model.py")
    show(nvim, fixed_document(real_document, project))
    buf = nvim.current.buffer
    before = annotations(nvim, buf)
    assert BODY_ROW in before and len(before) > 2
    buf[BODY_ROW] = buf[BODY_ROW] + " * 2"
    wait_for(lambda: BODY_ROW not in annotations(nvim, buf), "the edited line's costs to go", timeout=10)
    after = annotations(nvim, buf)
    assert set(after) == set(before) - {BODY_ROW}
    assert {group for _, group in after.values()} == {"SkylineStale"}
    assert state(nvim)["stale"] is True


def test_toggle_hides_and_shows_one_buffers_costs(editor, project, real_document):
    nvim = editor
    show(nvim, fixed_document(real_document, project))
    entry = nvim.current.buffer
    nvim.command(f"split {project}/model.py")
    model = nvim.current.buffer
    assert annotations(nvim, model) and annotations(nvim, entry)
    nvim.command("SkylineToggle")
    assert annotations(nvim, model) == {}
    assert annotations(nvim, entry)
    show(nvim, fixed_document(real_document, project))  # later results stay hidden there
    assert annotations(nvim, model) == {}
    nvim.command("SkylineToggle")
    assert annotations(nvim, model)
    assert_no_traceback(nvim)


def test_priorities_are_options(editor, project, real_document):
    nvim = editor
    nvim.exec_lua("require('skyline').setup({priorities = {virt_text = 77, signs = 33}, reprofile_delay_ms = 600000})")
    show(nvim, fixed_document(real_document, project))
    ns = nvim.api.create_namespace("skyline")
    marks = nvim.api.buf_get_extmarks(nvim.current.buffer, ns, 0, -1, {"details": True})
    assert marks and {details["priority"] for *_, details in marks} == {77}


def entry_literal(nvim, project) -> str:
    buf = nvim.funcs.bufnr(f"{project}/entry_point.py")
    return nvim.api.buf_get_lines(buf, ENTRY_LITERAL_ROW, ENTRY_LITERAL_ROW + 1, True)[0]


def test_batch_keys_work_in_every_project_file_and_repeat_with_dot(editor, project, real_document):
    nvim = editor
    show(nvim, fixed_document(real_document, project))
    nvim.command(f"edit {project}/model.py")
    model = nvim.current.buffer
    window = nvim.current.window
    cursor = (BODY_ROW + 1, 4)  # anywhere in model.py
    nvim.api.win_set_cursor(window, cursor)

    nvim.input("\\+")
    wait_for(lambda: "batch_size=256" in entry_literal(nvim, project), "the literal to become 256", timeout=10)
    assert nvim.current.buffer == model and nvim.current.window == window
    assert tuple(window.cursor) == cursor
    assert not nvim.api.buf_get_option(model, "modified")
    assert state(nvim)["batch_size"] == 256

    nvim.input(".")
    wait_for(lambda: "batch_size=512" in entry_literal(nvim, project), "the dot-repeat to double it", timeout=10)
    nvim.input("2.")  # a new count for the repeat: twice more
    wait_for(lambda: "batch_size=2048" in entry_literal(nvim, project), "2. to double it twice", timeout=10)
    nvim.input("\\-")
    wait_for(lambda: "batch_size=1024" in entry_literal(nvim, project), "the key to halve it", timeout=10)
    assert tuple(window.cursor) == cursor

    nvim.command(f"buffer {project}/entry_point.py")
    nvim.input("u")  # one undo step per press
    wait_for(lambda: "batch_size=2048" in entry_literal(nvim, project), "undo", timeout=10)
    assert_no_traceback(nvim)


def test_batch_keys_without_models_say_why_in_one_sentence(editor, project, real_document):
    nvim = editor
    withheld = "Only one batch size could be measured, so nothing is predicted."
    other = "Operations ran 57% slower while recorded than in the measured iteration."
    show(
        nvim, fixed_document(real_document, project, models=None, models_withheld=withheld, warnings=[other, withheld])
    )
    before = entry_literal(nvim, project)
    nvim.command(f"edit {project}/entry_point.py")
    nvim.input("\\+")
    said = wait_for_message(nvim, f"the last profile has no batch-size models: {withheld}")
    assert other not in said  # the reason, not every warning of the document
    assert entry_literal(nvim, project) == before
    assert_no_traceback(nvim)


def test_max_stays_in_the_trusted_range_and_asks_before_filling_the_machine(editor, project, real_document):
    nvim = editor
    doc = fixed_document(real_document, project)
    doc["device"]["memory_capacity_bytes"] = 24 * 2**20  # half of it: batch size 2,816 and above
    show(nvim, doc)
    nvim.command("SkylineBatchSize 1024")  # 5 MiB predicted: no question
    assert "batch_size=1024" in entry_literal(nvim, project)

    nvim.ui_attach(160, 50, rgb=True)  # confirm() asks only with a screen to ask on
    nvim.command("SkylineBatchSize max", async_=True)  # 4,096 (the trusted range's end): 17 MiB predicted
    wait_for(lambda: nvim.api.get_mode()["mode"] == "r?", "the question", timeout=10)
    nvim.input("n")
    # Back to Normal mode, no hit-enter prompt ("r") after the answer (else the next call hangs).
    wait_for(lambda: nvim.api.get_mode()["mode"] == "n", "the question to go", timeout=10)
    assert "batch_size=1024" in entry_literal(nvim, project)  # the answer was no
    nvim.ui_detach()

    nvim.command("SkylineBatchSize! max")  # no question
    wait_for_message(nvim, "beyond the trusted range (up to 4,096: 4× the largest measured): using 4,096")
    assert "batch_size=4096" in entry_literal(nvim, project)
    assert state(nvim)["batch_size"] == 4096

    nvim.command("SkylineBatchSize! 8192")
    low = doc["models"]["trusted_range"][0]
    wait_for_message(
        nvim, f"batch size 8,192 is outside the trusted range ({low:,}-4,096: up to 4× the largest measured)"
    )
    assert_no_traceback(nvim)


def test_max_says_where_the_users_code_fails(editor, project, real_document):
    nvim = editor
    doc = fixed_document(real_document, project)
    doc["models"]["failing_batch_sizes"] = [2049]
    doc["models"]["trusted_range"][1] = 2048
    show(nvim, doc)
    nvim.command("SkylineBatchSize! max")
    wait_for_message(nvim, "(up to 2,048: the batch size below 2049, where your code fails): using 2,048")
    assert "batch_size=2048" in entry_literal(nvim, project)
    assert_no_traceback(nvim)


def test_past_the_samples_per_step_no_time_is_predicted_and_the_message_says_why(editor, project, real_document):
    nvim = editor
    doc = fixed_document(real_document, project)
    doc["models"].update(samples_per_step=2048, micro_batches=1)  # the line is one micro-batch's
    doc["models"]["trusted_range"][1] = 2048
    show(nvim, doc)
    nvim.command("SkylineBatchSize! 1024")  # 2 micro-batches of 1,024 a step
    assert state(nvim)["prediction"]["run_time_ms"] == pytest.approx(2 * (2.0 + 0.05 * 1024))
    nvim.command("SkylineBatchSize! 1000")  # `2048 // 1000` micro-batches would take 2,000 a step
    wait_for_message(
        nvim,
        "batch size 1,000 does not divide your 2,048 samples per optimizer step: whole micro-batches of it cannot "
        "make them up (the time predicted counts 2.05 of them)",
    )
    nvim.command("SkylineBatchSize! 4096")
    wait_for_message(
        nvim,
        "batch size 4,096 is outside the trusted range (64-2,048: up to the samples per optimizer step, beyond "
        "which a step runs less than one micro-batch): no time is predicted there",
    )
    assert state(nvim)["prediction"].get("samples_per_second") is None  # nil: no key at all
    # The statusline says so, not `~—/s`.
    assert nvim.exec_lua("return require('skyline').status()").startswith("skyline b=4096 no time ~")
    assert_no_traceback(nvim)


def test_help_works_on_a_runtimepath_install_once_its_tags_are_made(nvim, tmp_path, repo):
    plugin = tmp_path / "skyline.nvim"  # a checkout put on the runtimepath by hand, never helptagged
    for folder in ("doc", "lua", "plugin"):
        shutil.copytree(repo / folder, plugin / folder, ignore=shutil.ignore_patterns("tags"))
    nvim.command("set runtimepath-=" + str(repo))
    nvim.command(f"set runtimepath^={plugin}")
    with pytest.raises(Exception, match="E149"):
        nvim.command("help skyline")
    nvim.command("checkhealth skyline")
    report = "\n".join(nvim.current.buffer[:])
    assert f"no help tags in {plugin / 'doc'}" in report and f":helptags {plugin / 'doc'}" in report

    nvim.command(f"helptags {plugin / 'doc'}")  # what the README says to run
    nvim.command("help skyline")
    assert nvim.current.buffer.name == str(plugin / "doc" / "skyline.txt")
    # At the top of the help, not at the first tag that starts with "skyline" (section 6's).
    assert "*skyline*" in nvim.current.line and nvim.current.window.cursor[0] <= 3
    nvim.command("checkhealth skyline")
    assert f"help tags in {plugin / 'doc'}" in "\n".join(nvim.current.buffer[:])
