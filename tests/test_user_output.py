"""The user's prints while an analysis runs: the first lines shown, the rest counted in a warning.

An iteration with a `print` ran thousands of times and buried the report under 68,143 lines. The
engine is real (one analysis of a tiny model, captured by pytest's capsys); the stream's line
counting is checked on a real text stream."""

from __future__ import annotations

import io
import sys

import pytest

from conftest import run_skyline
from engine_helpers import analysed
from skyline_engine.entry.user_output import SHOWN_LINES, first_lines_of_user_output

ENTRY = """\
import sys

import torch
import torch.nn as nn


def skyline_model_provider():
    print("building the model")
    return nn.Linear(4, 2)


def skyline_input_provider(batch_size=4):
    return (torch.randn(batch_size, 4),)


def skyline_iteration_provider(model):
    def iteration(x):
        loss = model(x).pow(2).mean()
        loss.backward()
        {report}

    return iteration
"""


def analysed_reporting(tmp_path, report: str) -> dict:
    return analysed(tmp_path, source=ENTRY.format(report=report), predict=False)


def output_notes(document: dict) -> list[str]:
    return [w for w in document["warnings"] if "Your code printed" in w]


@pytest.mark.slow
def test_a_printing_iteration_shows_its_first_lines_and_counts_the_rest(tmp_path, capsys):
    document = analysed_reporting(tmp_path, 'print("loss", float(loss.detach())); print("to stderr", file=sys.stderr)')
    out, err = capsys.readouterr()
    assert out.splitlines()[0] == "building the model"
    assert len(out.splitlines()) == SHOWN_LINES
    assert len(err.splitlines()) == SHOWN_LINES and set(err.splitlines()) == {"to stderr"}
    (note,) = output_notes(document)
    iterations = document["iteration"]["repetitions"]
    hidden = int(note.split("printed ")[1].split(" more")[0].replace(",", ""))
    # Every iteration printed a line to each stream: at least those timed, less the ones shown.
    assert hidden >= 2 * iterations - 2 * SHOWN_LINES + 1
    # Once the analysis is over, the streams are the user's again.
    print("after")
    assert capsys.readouterr().out == "after\n"


@pytest.mark.slow
def test_a_quiet_iteration_gets_no_note(tmp_path, capsys):
    document = analysed_reporting(tmp_path, "pass")
    assert capsys.readouterr().out == "building the model\n"
    assert output_notes(document) == []


def test_the_first_lines_pass_whole_and_the_rest_are_counted(monkeypatch):
    target = io.StringIO()
    monkeypatch.setattr(sys, "stdout", target)
    with first_lines_of_user_output(shown=3) as output:
        print("one\ntwo", end="")  # a write of two lines, the second unfinished
        print(" still two")
        sys.stdout.write("three\nfour\nfive\n")
        print("six", end="")
    assert target.getvalue() == "one\ntwo still two\nthree\n"
    assert output.hidden_lines == 3  # four, five and the unfinished six
    assert sys.stdout is target


STREAM_USER = """\
import faulthandler
import subprocess
import sys

import torch
import torch.nn as nn


def skyline_model_provider():
    faulthandler.enable()  # asks sys.stderr for its fileno
    return nn.Linear(4, 2)


def skyline_input_provider(batch_size=4):
    return (torch.randn(batch_size, 4),)


def skyline_iteration_provider(model):
    subprocess.run([sys.executable, "-c", "print('from a subprocess')"], stdout=sys.stdout, check=True)
    sys.stdout.buffer.write("bytes \\u00e9\\n".encode()[:7])  # a character split between two writes
    sys.stdout.buffer.write("bytes \\u00e9\\n".encode()[7:])

    def iteration(x):
        model(x).pow(2).mean().backward()

    return iteration
"""


@pytest.mark.slow
def test_the_streams_work_as_real_ones_for_code_that_needs_their_descriptor_or_bytes(tmp_path):
    # faulthandler.enable() and subprocess.run(stdout=sys.stdout) failed with `fileno`, and
    # sys.stdout.buffer.write with "'_FirstLines' object has no attribute 'buffer'".
    (tmp_path / "entry_point.py").write_text(STREAM_USER)
    result = run_skyline("profile", "entry_point.py", "--device", "cpu", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "from a subprocess" in result.stdout and "bytes \u00e9" in result.stdout
