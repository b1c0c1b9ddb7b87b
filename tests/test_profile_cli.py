"""End-to-end: `skyline profile` on the bundled examples, on the CPU, through the real CLI."""

import fcntl
import json
import os
import pty
import re
import select
import shutil
import struct
import subprocess
import sys
import termios

import pytest

from conftest import EXAMPLES, REPO, run_skyline
from nvim_helpers import documented_run_time

EXAMPLE_NAMES = ["default", "cnn", "transformer"]


@pytest.fixture(scope="module", params=EXAMPLE_NAMES)
def profiled(request, tmp_path_factory):
    out = tmp_path_factory.mktemp(request.param) / "analysis.json"
    result = run_skyline("profile", f"examples/{request.param}/entry_point.py", "--device", "cpu", "--json", out)
    assert result.returncode == 0, result.stderr
    return request.param, json.loads(out.read_text()), result


@pytest.mark.slow
def test_document_has_the_documented_fields_with_their_types(profiled):
    name, doc, _ = profiled
    assert doc["schema"] == "skyline.analysis/1"
    assert doc["project_root"] == str(REPO)
    assert doc["entry_point"] == f"examples/{name}/entry_point.py"
    assert doc["device"]["type"] == "cpu"
    assert isinstance(doc["device"]["name"], str) and doc["device"]["name"]
    assert isinstance(doc["device"]["memory_capacity_bytes"], int)
    assert isinstance(doc["batch_size"], int)
    for key in ("run_time_ms", "samples_per_second"):
        assert isinstance(doc["iteration"][key], float)
    assert isinstance(doc["iteration"]["peak_memory_bytes"], int)
    models = doc["models"]
    for sample in models["samples"]:
        assert isinstance(sample["batch_size"], int)
        assert isinstance(sample["run_time_ms"], float)
        assert isinstance(sample["peak_memory_bytes"], int)
    for model in ("run_time_ms", "peak_memory_bytes"):
        for key in ("slope", "bias", "r2"):
            assert isinstance(models[model][key], float)
    best = models["predicted_max_samples_per_second"]
    # The line predicts time when it grows and fits (R² of at least 0.95, or every time within 1 %
    # of it, docs/analysis-document.md); then there is a best batch size on this machine (it has
    # memory to spare), and the best throughput is the line's there. Otherwise neither, and a
    # warning says why.
    line = models["run_time_ms"]
    predicts = line["slope"] > 0 and (line["r2"] >= 0.95 or line["max_relative_residual"] <= 0.01)
    if predicts:
        b = models["best_batch_size"]
        assert best == pytest.approx(b / documented_run_time(models, b) * 1000, rel=1e-12)
    else:
        assert best is None and models["best_batch_size"] is None
        assert any("run-time model" in w or "did not follow" in w for w in doc["warnings"]), doc["warnings"]
    assert isinstance(models["max_batch_size"], int)
    location = doc["batch_size_location"]
    assert set(location) >= {"path", "line", "col_start", "col_end", "editable"}


@pytest.mark.slow
def test_measurements_are_real_and_consistent(profiled):
    _, doc, _ = profiled
    it = doc["iteration"]
    assert it["run_time_ms"] > 0
    assert it["peak_memory_bytes"] > 0
    assert it["samples_per_second"] == pytest.approx(doc["batch_size"] / it["run_time_ms"] * 1000)
    assert 0 < it["peak_memory_bytes"] < doc["device"]["memory_capacity_bytes"]
    samples = doc["models"]["samples"]
    assert len({s["batch_size"] for s in samples}) == 3
    assert doc["batch_size"] in {s["batch_size"] for s in samples}
    assert all(s["run_time_ms"] > 0 and s["peak_memory_bytes"] > 0 for s in samples)


@pytest.mark.slow
def test_peak_memory_grows_with_the_batch_size(profiled):
    _, doc, _ = profiled
    samples = sorted(doc["models"]["samples"], key=lambda s: s["batch_size"])
    peaks = [s["peak_memory_bytes"] for s in samples]
    assert peaks == sorted(peaks) and peaks[0] < peaks[-1]


def peak(memory, batch_size):
    """docs/analysis-document.md's formula: the highest of the model's lines."""
    return max(line["slope"] * batch_size + line["bias"] for line in memory["phases"])


@pytest.mark.slow
def test_models_reproduce_the_measured_samples_within_their_stated_fit(profiled):
    _, doc, _ = profiled
    models = doc["models"]
    rt, mem = models["run_time_ms"], models["peak_memory_bytes"]
    for sample in models["samples"]:
        b = sample["batch_size"]
        assert abs(rt["slope"] * b + rt["bias"] - sample["run_time_ms"]) / sample["run_time_ms"] <= (
            rt["max_relative_residual"] + 1e-9
        )
        # Tensor memory on the CPU is counted exactly, and each operation's bytes are affine in
        # the batch size: the envelope of their lines reproduces every measured peak.
        assert peak(mem, b) == pytest.approx(sample["peak_memory_bytes"], rel=1e-9)
    assert mem["fitted"] == "per_operation"
    assert mem["max_relative_residual"] < 1e-9


@pytest.mark.slow
def test_predictions_follow_the_models_and_respect_capacity(profiled):
    _, doc, _ = profiled
    models = doc["models"]
    rt, mem = models["run_time_ms"], models["peak_memory_bytes"]
    usable = doc["device"]["memory_capacity_bytes"] * (1 - models["memory_headroom_fraction"])
    largest = models["max_batch_size"]
    assert peak(mem, largest) <= usable < peak(mem, largest + 1)
    low, high = models["trusted_range"]
    # A busy machine can leave a line that fits poorly even after re-timing: it predicts no time.
    fits_well = rt["r2"] is None or rt["r2"] >= 0.95 or rt["max_relative_residual"] <= 0.01
    if not fits_well:
        assert any("fits the measurements poorly" in w for w in doc["warnings"])
    for p in doc["predictions"]:
        b = p["batch_size"]
        line = documented_run_time(models, b)  # past the largest timed, toward the checks there
        if rt["slope"] > 0 and line > 0 and fits_well:
            assert p["run_time_ms"] == pytest.approx(line)
            assert p["samples_per_second"] == pytest.approx(b / line * 1000)
        else:  # noisy times can give a line that crosses zero, or does not grow: no number then
            assert p["run_time_ms"] is None and p["samples_per_second"] is None
        assert p["peak_memory_bytes"] == pytest.approx(peak(mem, b))
        assert p["fits"] == (p["peak_memory_bytes"] <= usable)
        assert p["extrapolated"] == (not low <= b <= high)
    if rt["slope"] <= 0:
        assert models["predicted_max_samples_per_second"] is None
        assert any("did not grow with the batch size" in w for w in doc["warnings"])


@pytest.mark.slow
def test_batch_size_location_points_at_the_default_literal(profiled):
    _, doc, _ = profiled
    location = doc["batch_size_location"]
    line = (REPO / location["path"]).read_bytes().splitlines()[location["line"] - 1]
    assert line[location["col_start"] : location["col_end"]] == str(doc["batch_size"]).encode()
    assert location["editable"] is True


@pytest.mark.slow
def test_terminal_report_shows_throughput_memory_and_predictions(profiled):
    name, doc, result = profiled
    report = result.stdout
    assert f"examples/{name}/entry_point.py" in report
    summary = report.split("\n\n")[1].splitlines()  # after the header and a blank line: the answers
    first = [line for line in summary if not line.startswith(" ")][:3]  # each with its continued lines
    assert [line.split("  ")[0] for line in first] == ["Speed", "Memory", "Batch size"], report
    assert "samples/s" in first[0] and "peak of" in first[1]
    assert f"{doc['models']['max_batch_size']:,}" in report
    assert "largest that fits" in report
    assert "measuring batch size" in result.stderr  # progress while it works


@pytest.mark.slow
def test_progress_off_a_terminal_is_plain_lines(profiled):
    _, _, result = profiled
    assert "\r" not in result.stderr and "\x1b" not in result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) >= 4 and all(line.startswith("skyline: [") for line in lines), result.stderr
    assert lines[-1].startswith("skyline: [100%] done · ")


def run_in_terminal(*args, columns=160, timeout=240):
    """The real CLI with stdout and stderr on one pseudo-terminal, as in a user's shell: its exit
    status and the bytes the terminal received (output post-processing off, so that a newline
    arrives as written, not as CR LF)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    attributes = termios.tcgetattr(slave)
    attributes[1] &= ~termios.OPOST
    termios.tcsetattr(slave, termios.TCSANOW, attributes)
    process = subprocess.Popen(
        [sys.executable, "-m", "skyline_engine", *map(str, args)],
        cwd=REPO,
        env=dict(os.environ, TERM="xterm"),
        stdin=subprocess.DEVNULL,
        stdout=slave,
        stderr=slave,
    )
    os.close(slave)
    received = bytearray()
    try:
        while select.select([master], [], [], timeout)[0]:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: every writer of the terminal has closed it
                break
            if not chunk:
                break
            received += chunk
    finally:
        os.close(master)
    try:
        code = process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        raise
    return code, received.decode()


@pytest.mark.slow
def test_progress_on_a_terminal_is_one_line_rewritten_in_place_and_the_report_fits_it():
    code, output = run_in_terminal("profile", "examples/default/entry_point.py", "--device", "cpu", columns=80)
    assert code == 0, output
    progress, report = output[: output.index("Skyline · ")], output[output.index("Skyline · ") :]
    # One line: redrawn after each carriage return, ended by one newline before the report.
    assert progress.endswith("\n") and progress.count("\n") == 1, progress
    states = progress[:-1].split("\r")
    assert states[0] == "" and len(states) >= 4, states
    for state in states[1:]:
        assert state.startswith("skyline: [") and state.endswith("\x1b[K"), state
        assert len(state) - len("\x1b[K") < 80  # cut to the terminal's width: no wrapping
    shown = "".join(states)
    assert "measuring batch size 128" in shown and "timing batch sizes" in shown
    assert states[-1].startswith("skyline: [100%] done · ")
    assert "\r" not in report and report.startswith("Skyline · examples/default/entry_point.py")
    assert max(len(line) for line in report.splitlines()) <= 80, report
    assert "Hottest lines" in report and "Batch-size models" in report


@pytest.mark.slow
def test_rows_marked_measured_show_the_measurement_not_the_line(profiled):
    _, doc, result = profiled
    table = result.stdout.split("Batch sizes, measured and predicted\n")[1].split("\n\n")[0]
    rows = [line.split() for line in table.splitlines() if "measured" in line.split("   ")[-1]]
    # The models' samples, and the batch sizes the confirming step timed beside the user's (`checks`);
    # the user's batch size shows the document's iteration (timed alone), as the headline does.
    models = doc["models"]
    samples = {**{s["batch_size"]: s for s in models["checks"]}, **{s["batch_size"]: s for s in models["samples"]}}
    samples[doc["batch_size"]] = doc["iteration"]
    assert len(rows) == len(samples)
    for row in rows:
        sample = samples[int(row[0].replace(",", ""))]
        shown, unit = row[1], row[2]
        assert unit in ("ms", "s"), row
        # The measurement, to the digits shown (read here, not formatted by the code under test).
        digits = len(shown.split(".")[1]) if "." in shown else 0
        value_ms = float(shown) * (1000 if unit == "s" else 1)
        half_digit_ms = 0.5 * 10**-digits * (1000 if unit == "s" else 1)
        assert abs(value_ms - sample["run_time_ms"]) <= half_digit_ms + 1e-9, (row, sample["run_time_ms"])


@pytest.mark.slow
def test_batch_size_option_profiles_at_that_batch_size(tmp_path):
    out = tmp_path / "a.json"
    result = run_skyline(
        "profile", "examples/default/entry_point.py", "--device", "cpu", "--batch-size", "24", "--json", out, "--quiet"
    )
    assert result.returncode == 0, result.stderr
    doc = json.loads(out.read_text())
    assert doc["batch_size"] == 24
    assert 24 in {s["batch_size"] for s in doc["models"]["samples"]}
    assert result.stderr == ""


@pytest.mark.slow
def test_set_batch_size_rewrites_only_the_literal_then_profiles(tmp_path):
    project = tmp_path / "project"
    shutil.copytree(EXAMPLES / "default", project)
    entry = project / "entry_point.py"
    before = entry.read_text()
    out = tmp_path / "a.json"
    result = run_skyline(
        "profile", "entry_point.py", "--device", "cpu", "--set-batch-size", "48", "--json", out, "--quiet", cwd=project
    )
    assert result.returncode == 0, result.stderr
    assert entry.read_text() == before.replace("batch_size=128", "batch_size=48")
    doc = json.loads(out.read_text())
    assert doc["batch_size"] == 48
    assert doc["entry_point"] == "entry_point.py"


@pytest.mark.slow
def test_project_root_option_makes_paths_relative_to_it(tmp_path):
    out = tmp_path / "a.json"
    result = run_skyline(
        "profile",
        "examples/cnn/entry_point.py",
        "--project-root",
        "examples/cnn",
        "--device",
        "cpu",
        "--batch-size",
        "8",
        "--json",
        out,
        "--quiet",
    )
    assert result.returncode == 0, result.stderr
    doc = json.loads(out.read_text())
    assert doc["entry_point"] == "entry_point.py"
    assert doc["batch_size_location"]["path"] == "entry_point.py"


def sections(report: str) -> dict[str, str]:
    """A report's sections by their first word (the header is "Skyline", the summary "Speed")."""
    return {section.split()[0]: section for section in report.rstrip("\n").split("\n\n")}


def words(text: str) -> list[str]:
    return text.split()


@pytest.mark.slow
@pytest.mark.parametrize("width", [70, 80, 100, 140])
def test_the_report_fits_the_width_it_is_given_and_says_the_same(profiled, width):
    from skyline_engine.render.terminal import render_report

    _, doc, _ = profiled
    wide, narrow = render_report(doc), render_report(doc, width)
    too_long = [line for line in narrow.splitlines() if len(line) > width]
    assert not too_long, "\n".join(too_long)
    wide_sections, narrow_sections = sections(wide), sections(narrow)
    assert wide_sections.keys() == narrow_sections.keys()
    # Wrapping moves words, never changes them: every section but the hottest lines says the same.
    for name, section in wide_sections.items():
        if name != "Hottest":
            assert words(narrow_sections[name]) == words(section), name
    # The hottest lines: each row's place and figures, in the same order, with the line's source or
    # the start of it.
    header, *rows = wide_sections["Hottest"].splitlines()[1:]
    source_column = header.index("source")
    narrow_text = narrow_sections["Hottest"]
    position = 0
    for row in rows:
        place, *figures = words(row[:source_column])
        found = re.compile(rf"^  {re.escape(place)}(?: |$)", re.MULTILINE).search(narrow_text, position)
        assert found, (place, narrow_text)
        position = found.end()
        on_the_line, next_line = [*narrow_text[position:].split("\n"), ""][:2]
        if words(on_the_line)[: len(figures)] == figures:  # one line a row: the figures, then the source
            source = on_the_line
            for figure in figures:
                source = source.lstrip().removeprefix(figure)
            source = source.strip()
        else:  # the source beside the place, the figures on the next line
            assert words(next_line) == figures, (row, on_the_line, next_line)
            source = on_the_line.strip()
        if place != "untracked":
            path, number = place.rsplit(":", 1)
            full = (REPO / path).read_text().splitlines()[int(number) - 1].strip()
            assert full.startswith(source.removesuffix("…")) and len(source) >= min(len(full), 10), (source, full)


def test_the_reports_width_is_columns_else_the_terminals_else_none():
    from skyline_engine.cli.screen import report_width

    read, write = os.pipe()
    with os.fdopen(read) as _, os.fdopen(write, "w") as pipe:
        assert report_width(pipe, {}) is None  # a pipe or a file: no limit
        assert report_width(pipe, {"COLUMNS": "90"}) == 90
        assert report_width(pipe, {"COLUMNS": "wide"}) is None
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 100, 0, 0))
    with os.fdopen(master) as _, os.fdopen(slave, "w") as terminal:
        assert report_width(terminal, {}) == 100
        assert report_width(terminal, {"COLUMNS": "72"}) == 72


# A user's module that keeps a tensor alive from its import on (a dataset held in memory).
KEEPS_A_TENSOR = """
import torch

DATASET = torch.randn(4096, 64)  # 1 MiB, alive through the whole analysis


def skyline_model_provider():
    return torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))


def skyline_input_provider(batch_size=32):
    return (DATASET[torch.randint(0, len(DATASET), (batch_size,))],)


def skyline_iteration_provider(model):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    def iteration(x):
        optimizer.zero_grad()
        model(x).pow(2).mean().backward()
        optimizer.step()

    return iteration
"""

# The same analysis in a process that freezes nothing: `analyze` called as a function.
ANALYZED_AS_A_FUNCTION = """
import json, sys
from pathlib import Path
from skyline_engine.analysis.session import AnalysisRequest, analyze
document = analyze(AnalysisRequest("entry_point.py", Path(sys.argv[1]), device="cpu")).to_dict()
print(json.dumps(document))
"""


@pytest.mark.slow
def test_the_programs_frozen_imports_hide_none_of_the_users_tensors(tmp_path):
    """The program freezes what it imported before the user's code runs (measure/memory.py,
    `freeze_imports`, without a collection): the memory it reports is, to the byte, what the same
    analysis reports in a process that froze nothing, the tensor the user's module keeps included."""
    (tmp_path / "entry_point.py").write_text(KEEPS_A_TENSOR)
    out = tmp_path / "program.json"
    result = run_skyline("profile", "entry_point.py", "--device", "cpu", "--json", out, "--quiet", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    program = json.loads(out.read_text())
    plain = subprocess.run(
        [sys.executable, "-c", ANALYZED_AS_A_FUNCTION, str(tmp_path)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=240,
        check=True,
    )
    function = json.loads(plain.stdout.strip().splitlines()[-1])

    def peaks(document):
        return {s["batch_size"]: s["peak_memory_bytes"] for s in document["models"]["samples"]}

    assert program["iteration"]["peak_memory_bytes"] >= 4096 * 64 * 4  # the dataset is counted
    assert program["iteration"]["peak_memory_bytes"] == function["iteration"]["peak_memory_bytes"]
    common = peaks(program).keys() & peaks(function).keys()
    assert 32 in common
    assert {b: peaks(program)[b] for b in common} == {b: peaks(function)[b] for b in common}
