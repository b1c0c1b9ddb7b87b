"""`skyline time`, `skyline memory` and `--trace`, read back as a user would: with SQL, with JSON."""

import json
import os
import shutil
import sqlite3
from pathlib import Path

import pytest

from conftest import run_skyline
from engine_helpers import marked_line
from skyline_engine.render.files import write_json_atomic
from skyline_engine.render.sqlite_report import write_memory_report

PROJECT = Path(__file__).parent / "projects" / "breakdown"


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("reports")
    shutil.copytree(PROJECT, root, dirs_exist_ok=True)
    return root


@pytest.mark.slow
def test_run_time_report_answers_skylines_queries(project):
    result = run_skyline("time", "entry_point.py", "-o", "time.sqlite", "--device", "cpu", cwd=project)
    assert result.returncode == 0, result.stderr
    db = sqlite3.connect(project / "time.sqlite")
    assert db.execute("PRAGMA user_version").fetchone() == (1,)
    rows = db.execute("SELECT operation_name, forward_ms, backward_ms FROM run_time_entries").fetchall()
    assert rows and all(forward >= 0 and backward >= 0 for _, forward, backward in rows)
    per_line = {
        (path, line): (forward, backward)
        for path, line, forward, backward in db.execute(
            "SELECT f.file_path, f.line_number, SUM(e.forward_ms), SUM(e.backward_ms) "
            "FROM run_time_entries e JOIN stack_frames f ON f.entry_id = e.id AND f.ordering = 0 "
            "GROUP BY f.file_path, f.line_number"
        )
    }
    loop = per_line[("model.py", marked_line(project / "model.py", "# LOOP"))]
    assert loop[0] > 0 and loop[1] > 0
    helper = per_line[("helpers.py", marked_line(project / "helpers.py", "# HELPER"))]
    assert helper[0] > 0 and helper[1] > 0
    # Outer frames follow the innermost one: the helper was called from the model's forward.
    outer = db.execute(
        "SELECT f2.file_path, f2.line_number FROM stack_frames f1 JOIN stack_frames f2 "
        "ON f2.entry_id = f1.entry_id AND f2.ordering = 1 WHERE f1.file_path = 'helpers.py' AND f1.line_number = ?",
        (marked_line(project / "helpers.py", "# HELPER"),),
    ).fetchall()
    assert ("model.py", marked_line(project / "model.py", "# HELPER_CALL")) in outer


@pytest.mark.slow
def test_memory_report_answers_skylines_queries(project):
    result = run_skyline("memory", "entry_point.py", "-o", "memory.sqlite", "--device", "cpu", "--quiet", cwd=project)
    assert result.returncode == 0, result.stderr
    db = sqlite3.connect(project / "memory.sqlite")
    assert db.execute("SELECT entry_type, name FROM entry_types ORDER BY entry_type").fetchall() == [
        (1, "weight"),
        (2, "activation"),
    ]
    weights = {
        name: (size, grad, path, line)
        for name, size, grad, path, line in db.execute(
            "SELECT w.name, w.size_bytes, w.grad_size_bytes, f.file_path, f.line_number FROM weight_entries w "
            "JOIN stack_correlation c ON c.entry_id = w.id AND c.entry_type = 1 "
            "JOIN stack_frames f ON f.correlation_id = c.correlation_id AND f.ordering = 0"
        )
    }
    assert weights["model.inp.weight"] == (
        32 * 128 * 4,
        32 * 128 * 4,
        "model.py",
        marked_line(project / "model.py", "# INPUT_LAYER"),
    )
    activations = db.execute(
        "SELECT a.operation_name, a.size_bytes, f.file_path, f.line_number FROM activation_entries a "
        "JOIN stack_correlation c ON c.entry_id = a.id AND c.entry_type = 2 "
        "JOIN stack_frames f ON f.correlation_id = c.correlation_id AND f.ordering = 0"
    ).fetchall()
    assert any(line == marked_line(project / "model.py", "# LOOP") and size > 0 for _, size, _, line in activations)
    (peak,) = db.execute("SELECT size_bytes FROM misc_sizes WHERE key = 'peak_usage_bytes'").fetchone()
    assert peak >= sum(size + grad for size, grad, _, _ in weights.values())


@pytest.mark.slow
def test_the_reports_warnings_go_to_stderr_beside_the_file(tmp_path):
    # A leak changes what a memory report means, and its schema has no place to say so.
    root = tmp_path / "training_loops"
    shutil.copytree(Path(__file__).parent / "projects" / "training_loops", root)
    result = run_skyline("memory", "keeps_graphs.py", "-o", "memory.sqlite", "--device", "cpu", "--quiet", cwd=root)
    assert result.returncode == 0, result.stderr
    assert (root / "memory.sqlite").exists()
    assert result.stderr.startswith("Warnings\n  ! "), result.stderr  # --quiet: no progress, no "wrote"
    said = " ".join(result.stderr.split())
    assert "! Tensor memory grows by" in said and "made at model.py:12 (64.0 KiB)" in said, said


@pytest.mark.slow
def test_trace_is_a_chrome_trace_of_one_iteration(project):
    result = run_skyline(
        "profile",
        "entry_point.py",
        "--trace",
        "trace.json",
        "--json",
        "doc.json",
        "--device",
        "cpu",
        "--quiet",
        cwd=project,
    )
    assert result.returncode == 0, result.stderr
    trace = json.loads((project / "trace.json").read_text())
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert {e["tid"] for e in spans} == {1, 2, 3}  # forward, backward and optimizer tracks
    step = marked_line(project / "entry_point.py", "# STEP")
    optimizer = [e for e in spans if e["tid"] == 3]
    assert optimizer and all(
        e["cat"] == "optimizer" and e["name"].endswith(f"entry_point.py:{step}") for e in optimizer
    )
    assert all(e["dur"] >= 0 and e["ts"] >= 0 for e in spans)
    loop = marked_line(project / "model.py", "# LOOP")
    assert any(e["name"] == f"addmm · model.py:{loop}" for e in spans)
    forward = [e for e in spans if e["tid"] == 1]
    assert forward == sorted(forward, key=lambda e: e["ts"])
    document = json.loads((project / "doc.json").read_text())
    assert len(document["timeline"]) == len(spans)
    # Run as `python -m` from the project root: runpy's pseudo-files (`<frozen runpy>`) resolve
    # against the working directory, yet they are no files of the project.
    for context in all_contexts(document):
        assert (project / context["path"]).is_file(), context


def all_contexts(document):
    def tree(node):
        yield from node["contexts"]
        for child in node["children"]:
            yield from tree(child)

    yield from tree(document["operations"])
    for weight in document["weights"]:
        yield from weight["contexts"]
    for line in document["lines"]:
        yield {"path": line["path"], "line": line["line"]}


@pytest.mark.slow
def test_report_output_path_is_checked_before_the_analysis(project):
    result = run_skyline("time", "entry_point.py", "-o", "missing/time.sqlite", "--device", "cpu", cwd=project)
    assert result.returncode == 1
    assert "cannot write --output 'missing/time.sqlite'" in result.stderr
    assert "measuring" not in result.stderr


def test_every_output_gets_the_usual_permissions_and_keeps_an_existing_files(tmp_path):
    """SQLite reports came out 0600 (mkstemp's mode) while JSON was 0644: both now take the mode a
    new file gets (0666 less the umask), and a file written over keeps its own."""
    document = {
        "operations": {"kind": "module", "children": []},
        "weights": [],
        "iteration": {"peak_memory_bytes": 1},
    }
    previous = os.umask(0o027)
    try:
        write_json_atomic(tmp_path / "out.json", document)
        write_memory_report(tmp_path / "out.sqlite", document)
        kept = tmp_path / "kept.sqlite"
        kept.write_bytes(b"")
        kept.chmod(0o604)
        write_memory_report(kept, document)
    finally:
        os.umask(previous)
    assert (tmp_path / "out.json").stat().st_mode & 0o777 == 0o640
    assert (tmp_path / "out.sqlite").stat().st_mode & 0o777 == 0o640
    assert kept.stat().st_mode & 0o777 == 0o604
    assert sqlite3.connect(kept).execute("SELECT size_bytes FROM misc_sizes").fetchone() == (1,)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept.sqlite", "out.json", "out.sqlite"]  # no leftovers
