"""Data-parallel analyses in a real Neovim (issue 13): a line's exposed all-reduce time in its
costs, the breakdown's "Data parallel" section (ranks, the slowest marked, communication, the
link, throughput by world size), and the world size a profile asks for (`:[N]SkylineProfile`,
the `world_size` option).

As in test_nvim_editor.py, the document is the real one of the default example, shown through
`profile.show()`, with a `distributed` object of fixed numbers written into it.
"""

from __future__ import annotations

import pytest

import test_nvim_editor
from nvim_helpers import annotations, assert_no_traceback
from test_nvim_editor import MODEL_CALL_ROW, fixed_document, float_lines, show

# The fixtures of test_nvim_editor.py: its real document, and the editor on the entry point.
real_document = test_nvim_editor.real_document
editor = test_nvim_editor.editor

DISTRIBUTED = {
    "world_size": 2,
    "backend": "gloo",
    "threads_per_rank": 4,
    "ranks": [
        {"rank": 0, "run_time_ms": 54.1, "compute_ms": 50.2, "peak_memory_bytes": 11429478},
        {"rank": 1, "run_time_ms": 56.9, "compute_ms": 51.0, "peak_memory_bytes": 11534336},
    ],
    "slowest_rank": 1,
    "buckets": [
        {
            "index": 0,
            "size_bytes": 26214400,
            "parameters": ["body.0.weight"],
            "all_reduce_ms": 3.2,
            "exposed_ms": 1.2,
            "lines": [{"path": "entry_point.py", "line": MODEL_CALL_ROW + 1}],
        }
    ],
    "communication": {"all_reduce_ms": 3.2, "exposed_ms": 1.2, "compute_ms": 51.0},
    "link": {"description": "shared memory", "source": "measured", "latency_us": 12.5, "bandwidth_gbps": 40.0},
    "scaling": [
        {
            "world_size": 1,
            "samples_per_second": 2404.2,
            "iteration_ms": 53.24,
            "exposed_ms": 0.0,
            "extrapolated": False,
            "measured_samples_per_second": None,
        },
        {
            "world_size": 2,
            "samples_per_second": 4600.0,
            "iteration_ms": 55.6,
            "exposed_ms": 1.2,
            "extrapolated": False,
            "measured_samples_per_second": 4498.7,
        },
        {
            "world_size": 8,
            "samples_per_second": 17012.3,
            "iteration_ms": 60.2,
            "exposed_ms": 6.8,
            "extrapolated": True,
            "measured_samples_per_second": None,
        },
    ],
}


def distributed_document(real: dict, project) -> dict:
    """The fixed document with `distributed`, and 1.2 ms of exposed all-reduce on the entry
    point's `loss = model(...)` line (null on every other line, as the engine writes it)."""
    doc = fixed_document(real, project, distributed=DISTRIBUTED)
    lines = [line for line in doc["lines"] if (line["path"], line["line"]) != ("entry_point.py", MODEL_CALL_ROW + 1)]
    for line in lines:
        line["communication_ms"] = None
    caller = {"path": "entry_point.py", "line": MODEL_CALL_ROW + 1, "forward_ms": 0.0, "backward_ms": 0.0}
    caller.update(step_ms=0.0, memory_bytes=0, invocations=1, communication_ms=1.2)
    caller["inclusive"] = {"forward_ms": 30.0, "backward_ms": 15.5, "step_ms": 0.0}
    doc["lines"] = [*lines, caller]
    return doc


def test_a_line_shows_its_exposed_communication(editor, project, real_document):
    nvim = editor
    show(nvim, distributed_document(real_document, project))
    marks = annotations(nvim, nvim.current.buffer)
    assert marks[MODEL_CALL_ROW][0] == "with calls 45.50 ms (85.5%) · comm 1.20 ms"
    assert all("comm" not in text for row, (text, _) in marks.items() if row != MODEL_CALL_ROW)
    assert_no_traceback(nvim)


def test_a_single_process_document_has_no_communication_or_data_parallel_section(editor, project, real_document):
    nvim = editor
    show(nvim, fixed_document(real_document, project, distributed=None))
    marks = annotations(nvim, nvim.current.buffer)
    assert marks and all("comm" not in text for text, _ in marks.values())
    lines, _ = float_lines(nvim)
    assert not any(line.startswith(("Data parallel", "World size")) for line in lines)
    assert_no_traceback(nvim)


@pytest.mark.parametrize("columns", [140, 80])
def test_the_float_shows_the_ranks_the_link_and_the_scaling(editor, project, real_document, columns):
    nvim = editor
    nvim.options["columns"] = columns
    doc = distributed_document(real_document, project)
    doc["distributed"]["link"]["description"] = "loopback (gloo on one machine)"  # the longest the engine names
    show(nvim, doc)
    lines, width = float_lines(nvim)
    assert width <= columns - 4
    assert all(nvim.funcs.strdisplaywidth(line) <= width for line in lines), lines
    start = next(i for i, line in enumerate(lines) if line.startswith("Data parallel"))
    assert "2 ranks × 4 threads, gloo" in lines[start]
    ranks = {int(line.split()[1]): line for line in lines[start + 1 : start + 3]}
    assert ranks[0].endswith("54.10 ms   10.9 MiB")  # not the slowest
    assert "56.90 ms" in ranks[1] and "11.0 MiB" in ranks[1] and ranks[1].endswith("11.0 MiB  slowest")
    section = " ".join(" ".join(lines[start:]).split())  # wrapped, not cut
    assert "all-reduce 1.20 ms exposed (2.3%) of 3.20 ms, compute 51.00 ms" in section
    assert "link loopback (gloo on one machine) (measured): 12.5 µs, 40.0 Gbit/s" in section
    header = next(i for i, line in enumerate(lines) if line.startswith("World size"))
    rows = {int(line[:12].strip("▸ ")): line for line in lines[header + 1 : header + 4]}
    assert sorted(rows) == [1, 2, 8]
    assert "2,404" in rows[1] and "measured" not in rows[1] and "extrapolated" not in rows[1]
    assert rows[2].startswith("▸") and "4,499" in rows[2] and rows[2].rstrip().endswith("measured")
    assert "17,012" in rows[8] and rows[8].rstrip().endswith("extrapolated")
    # Aligned: the throughput and the iteration time start in the same column on every row.
    assert len({row.index(" ms") for row in rows.values()}) == 1
    assert_no_traceback(nvim)


# Records the requests the plugin hands to the engine instead of sending them.
RECORD_REQUESTS = """
vim.g.skyline_test_sent = {}
require('skyline.engine').profile = function(_, request)
  local sent = vim.g.skyline_test_sent
  table.insert(sent, request)
  vim.g.skyline_test_sent = sent
  return true
end
"""


def sent_world_sizes(nvim) -> list:
    return [request.get("world_size") for request in nvim.vars["skyline_test_sent"]]


def test_the_count_of_skyline_profile_is_the_world_size(editor):
    nvim = editor
    nvim.exec_lua(RECORD_REQUESTS)
    nvim.command("2SkylineProfile")
    nvim.command("SkylineProfile")  # no count: the option's default, 1
    nvim.exec_lua("require('skyline').setup({world_size = 4, profile_on_save = false})")
    nvim.command("SkylineProfile")
    nvim.command("3SkylineProfile")  # the count overrides the option
    assert sent_world_sizes(nvim) == [2, 1, 4, 3]
    # A re-profile (a save, a batch-size change) keeps the world size of the profile it repeats.
    nvim.exec_lua("require('skyline.profile').start(require('skyline.state').request.entry, {quiet = true})")
    assert sent_world_sizes(nvim)[-1] == 3
    assert_no_traceback(nvim)


@pytest.mark.parametrize("value", [0, -2, 1.5, "2"])
def test_the_world_size_option_is_an_integer_of_at_least_1(nvim, value):
    ok, message = nvim.exec_lua("return {require('skyline.config').apply({world_size = ...})}", value)
    assert ok is False
    assert message.startswith("world_size: expected an integer >= 1")
