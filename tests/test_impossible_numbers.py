"""No impossible number reaches a user, from measurements that invite them: a time line that
falls with the batch size, one through noise, one that crosses zero, and memory that "fits"
millions of samples. The measurements are written here (no timing), the document is the engine's,
and it is read by the terminal report, as JSON, and by a real Neovim (chart, hint, state, status).
"""

from __future__ import annotations

import json
import math
import re

import pytest
import torch

from nvim_helpers import as_lua_receives, assert_no_traceback, state
from skyline_engine.analysis.assembly import build_document
from skyline_engine.attribute.breakdown import Attribution, Breakdown, OperationNode, Untracked
from skyline_engine.measure.device import DeviceInfo
from skyline_engine.measure.iteration import Sample
from skyline_engine.measure.memory import MemoryProfile
from skyline_engine.measure.timing import TimingStats
from skyline_engine.predict.batch_models import BatchSizeModels
from skyline_engine.render.terminal import render_report
from skyline_engine.vocabulary import FORWARD_BACKWARD

MEASURED = (64, 128, 256)
CASES = {
    "falling": (30.0, 20.0, 10.0),  # a bottleneck elsewhere, or noise: time does not grow
    "noise": (10.0, 40.0, 22.0),  # R² far below 0.95
    "crossing_zero": (2.0, 10.0, 26.0),  # 0.125 ms a sample − 6 ms: no time below 48 samples
}


def document(times, batch_size=128):
    samples = [
        Sample(
            b,
            TimingStats(t, 0.1, 20, 1),
            MemoryProfile(0, (1000 * b + 8_000_000,), ("addmm",), ((0, FORWARD_BACKWARD),)),
        )
        for b, t in zip(MEASURED, times)
    ]
    models = BatchSizeModels.fit(
        [s.batch_size for s in samples],
        [s.run_time_ms for s in samples],
        {s.batch_size: s.memory for s in samples},
        24 << 30,
    )
    breakdown = Breakdown(
        [], OperationNode("iteration", "", "module"), [], [], Untracked(0.0, 0), Attribution(1, 0.0, 0.0, None, 1.0)
    )
    return build_document(
        project_root="/nowhere",
        entry_point="entry_point.py",
        torch_version=torch.__version__,
        device=DeviceInfo(torch.device("cpu"), "a CPU", 24 << 30, "user"),
        batch_size=batch_size,
        samples=samples,
        breakdown=breakdown,
        models=models,
        batch_size_location=None,
        warnings=models.warnings(),
    ).to_dict()


@pytest.mark.parametrize("case", CASES)
def test_the_document_holds_no_impossible_prediction(case):
    doc = document(CASES[case])
    json.dumps(doc, allow_nan=False)  # no NaN or infinity anywhere
    for p in doc["predictions"]:
        assert p["run_time_ms"] is None or p["run_time_ms"] > 0, p
        assert p["samples_per_second"] is None or p["samples_per_second"] > 0, p
        assert (p["run_time_ms"] is None) == (p["samples_per_second"] is None)
    models = doc["models"]
    assert models["max_batch_size_extrapolated"]  # millions on 24 GiB: never a plain answer
    if case in ("falling", "noise"):
        assert all(p["run_time_ms"] is None for p in doc["predictions"] if not p["measured"])
        assert models["throughput_knee_batch_size"] is None and models["predicted_max_samples_per_second"] is None
    else:
        by_size = {p["batch_size"]: p for p in doc["predictions"]}
        assert by_size[64]["run_time_ms"] == pytest.approx(2.0)
        assert any(w for w in doc["warnings"] if "negative intercept" in w)


NUMBER = re.compile(r"[-−]\s?\d|nan|inf", re.IGNORECASE)


@pytest.mark.parametrize("case", CASES)
def test_the_terminal_report_shows_no_impossible_number(case):
    doc = document(CASES[case])
    report = render_report(doc)
    summary = report.split("\n\n")[1]
    table = report[report.index("Batch sizes, measured and predicted") : report.index("Batch-size models")]
    for text in (summary, table):
        assert not NUMBER.search(text), text
    largest = doc["models"]["max_batch_size"]
    assert f"more than {doc['models']['trusted_range'][1]:,}" in summary  # not a plain answer
    assert f"{largest:,}" in table and "largest that fits, extrapolated" in table


def load(nvim, project, doc):
    """The document, as the remote plugin delivers a complete analysis (nulls dropped)."""
    entry = f"{project}/entry_point.py"
    nvim.command(f"edit {entry}")
    nvim.exec_lua(
        "local state = require('skyline.state')\n"
        "state.request = {generation = 1, entry = ..., root = vim.fs.dirname(...), buffers = {},"
        " analysis_id = 1, wall = vim.uv.clock_gettime('realtime')}\n"
        "state.running = true",
        entry,
    )
    nvim.exec_lua(
        "require('skyline.engine').on_message({event = 'analysis', analysis_id = 1, partial = false, document = ...})",
        as_lua_receives(doc),
    )


@pytest.mark.parametrize("case", CASES)
def test_the_editor_shows_no_impossible_number(nvim, project, case):
    doc = document(CASES[case])
    doc["project_root"] = str(project)
    load(nvim, project, doc)
    for batch_size in ("2048", "8", "64"):  # far beyond, below, and at a measured size
        nvim.command(f"SkylineBatchSize {batch_size}")
        current = state(nvim)
        prediction = current["prediction"]
        for key in ("run_time_ms", "samples_per_second", "peak_memory_bytes"):
            value = prediction.get(key)
            assert value is None or (value > 0 and math.isfinite(value)), (batch_size, key, value)
        assert prediction["extrapolated"] == (int(batch_size) in (2048, 8))
        assert not NUMBER.search(nvim.exec_lua("return require('skyline').status()"))
    nvim.command("SkylineBreakdown")
    text = "\n".join(nvim.current.buffer[:])
    chart = text[text.index("Batch size") : text.index("Operations") if "Operations" in text else None]
    assert not NUMBER.search(chart), chart
    assert_no_traceback(nvim)
