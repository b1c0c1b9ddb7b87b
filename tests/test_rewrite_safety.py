"""`skyline profile --set-batch-size N` and the user's file (#12 item 9): the default rewritten
is that of the definition that ran.

The tests call the function the command line runs before its analysis, on real files, with the
real loader importing the entry point.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from skyline_engine.analysis.session import AnalysisRequest, analyze
from skyline_engine.cli import _set_batch_size  # what `skyline profile --set-batch-size N` runs first
from skyline_engine.errors import SkylineError
from skyline_engine.measure.timing import TimingBudget

ENTRY = "entry_point.py"

HEAD = """\
import functools

import torch


def skyline_model_provider():
    return torch.nn.Linear(2, 1)


def skyline_iteration_provider(model):
    def iteration(x):
        model(x).sum().backward()

    return iteration

"""


def write_entry(root: Path, providers: str) -> Path:
    path = root / ENTRY
    path.write_text(HEAD + providers)
    return path


def set_batch_size(root: Path, batch_size: int) -> None:
    _set_batch_size(ENTRY, root, root, batch_size)


def defaults(path: Path) -> list[str]:
    """Every `batch_size=` default in the file, in order."""
    return re.findall(r"batch_size=(\w+)", path.read_text())


# --- the definition that ran (item 9) --------------------------------------------------------

IF_ELSE = """
SMALL = True
if SMALL:
    def skyline_input_provider(batch_size=8):
        return (torch.randn(batch_size, 2),)
else:
    def skyline_input_provider(batch_size=64):
        return (torch.randn(batch_size, 2),)
"""


@pytest.mark.parametrize(
    "providers, before, after",
    [
        pytest.param(
            IF_ELSE,
            ["8", "64"],
            ["4", "64"],
            id="if-else",
        ),
        pytest.param(
            """
try:
    import json  # present: the `try` branch's definition runs
    def skyline_input_provider(batch_size=16):
        return (torch.randn(batch_size, 2),)
except ImportError:
    def skyline_input_provider(batch_size=32):
        return (torch.randn(batch_size, 2),)
""",
            ["16", "32"],
            ["4", "32"],
            id="try-except",
        ),
        pytest.param(
            """
def skyline_input_provider(batch_size=8):
    return (torch.randn(batch_size, 2),)


_first = skyline_input_provider


def skyline_input_provider(batch_size=128):  # replaced below: this one never runs
    return (torch.randn(batch_size, 2),)


skyline_input_provider = _first
""",
            ["8", "128"],
            ["4", "128"],
            id="later-redefinition",
        ),
        pytest.param(
            """
def skyline_input_provider(batch_size=8):
    return (torch.randn(batch_size, 2),)


@functools.lru_cache()
def skyline_input_provider(batch_size=24):
    return (torch.randn(batch_size, 2),)
""",
            ["8", "24"],
            ["8", "4"],
            id="decorated-last",
        ),
    ],
)
def test_the_default_rewritten_is_that_of_the_definition_that_ran(tmp_path, providers, before, after):
    path = write_entry(tmp_path, providers)
    assert defaults(path) == before
    set_batch_size(tmp_path, 4)
    assert defaults(path) == after


def test_the_analysis_locates_the_default_of_the_definition_that_ran(tmp_path):
    """The editor's batch-size keys edit where the document's `batch_size_location` says."""
    path = write_entry(tmp_path, IF_ELSE)
    quick = TimingBudget(warmup_iterations=1, min_run_s=0.02, max_run_s=0.2)
    document = analyze(AnalysisRequest(ENTRY, tmp_path, device="cpu", predict=False, budget=quick)).to_dict()
    location = document["batch_size_location"]
    line = path.read_text().split("\n")[location["line"] - 1]
    assert (location["value"], line.encode()[location["col_start"] : location["col_end"]]) == (8, b"8")
    assert "batch_size=8" in line


@pytest.mark.parametrize(
    "providers, files, says",
    [
        pytest.param(
            """
def _inputs(batch_size=8, scale=1):
    return (scale * torch.randn(batch_size, 2),)


skyline_input_provider = functools.partial(_inputs, scale=2)
""",
            {},
            "it is a partial, not a function defined with `def`",
            id="partial",
        ),
        pytest.param(
            "from inputs import skyline_input_provider\n",
            {
                "inputs.py": "import torch\n\n\ndef skyline_input_provider(batch_size=8):\n"
                "    return (torch.randn(batch_size, 2),)\n"
            },
            "it is defined in inputs.py, not in this file",
            id="another-file",
        ),
    ],
)
def test_a_definition_that_cannot_be_known_is_refused_naming_the_file(tmp_path, providers, files, says):
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    path = write_entry(tmp_path, providers)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()}
    with pytest.raises(SkylineError) as caught:
        set_batch_size(tmp_path, 4)
    error = caught.value
    assert error.path == ENTRY
    assert "cannot tell which definition of `skyline_input_provider`" in error.message
    assert says in error.message
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()} == before
    assert path.read_bytes() == before[ENTRY]
