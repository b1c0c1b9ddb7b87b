"""The command line's project root when none is given: the working directory, or for an entry
point outside it the root the editor would find (the nearest folder with a root marker, else the
entry point's own folder). Real folders in tmp_path, and one real `skyline time` from elsewhere."""

from __future__ import annotations

import re
import sqlite3

import pytest

from conftest import REPO, run_skyline
from skyline_engine.entry.project_root import ROOT_MARKERS, default_project_root

ENTRY = """\
import torch
import torch.nn as nn

from helper import loss_of


def skyline_model_provider():
    return nn.Linear(4, 2)


def skyline_input_provider(batch_size=4):
    return (torch.randn(batch_size, 4),)


def skyline_iteration_provider(model):
    def iteration(x):
        loss_of(model, x).backward()

    return iteration
"""
HELPER = "def loss_of(model, x):\n    return model(x).pow(2).mean()\n"


def test_an_entry_point_inside_the_working_directory_keeps_it(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "pyproject.toml").write_text("")
    assert default_project_root("pkg/entry_point.py", tmp_path) == tmp_path


@pytest.mark.parametrize("marker", ROOT_MARKERS)
def test_outside_it_the_nearest_folder_with_a_marker(tmp_path, marker):
    project, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    (project / "train" / "deep").mkdir(parents=True)
    elsewhere.mkdir()
    marked = project / marker
    marked.mkdir() if marker == ".git" else marked.write_text("")
    (project / "train" / "deep" / "entry_point.py").write_text(ENTRY)
    assert default_project_root("../project/train/deep/entry_point.py", elsewhere) == project
    assert default_project_root(str(project / "train/deep/entry_point.py"), elsewhere) == project


def test_outside_it_without_a_marker_the_entry_points_folder(tmp_path):
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    assert default_project_root("../a/b/entry_point.py", tmp_path / "elsewhere") == (tmp_path / "a" / "b")
    # A missing entry point: its nearest folder, so that the error says it does not exist.
    assert default_project_root("../a/b/c/missing.py", tmp_path / "elsewhere") == (tmp_path / "a" / "b")


def test_the_markers_are_the_editors():
    config = (REPO / "lua" / "skyline" / "config.lua").read_text(encoding="utf-8")
    default = re.search(r"name = 'root_markers',\s*default = \{([^}]*)\}", config)
    assert default is not None
    assert tuple(re.findall(r"'([^']+)'", default.group(1))) == ROOT_MARKERS


@pytest.mark.slow
def test_profiling_an_entry_point_from_another_folder(tmp_path):
    """Run from elsewhere, the analysis finds the helper beside the entry point, attributes its
    line, and names files relative to the marked root."""
    project, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    (project / "train").mkdir(parents=True)
    elsewhere.mkdir()
    (project / "pyproject.toml").write_text("")
    (project / "train" / "entry_point.py").write_text(ENTRY)
    (project / "train" / "helper.py").write_text(HELPER)
    result = run_skyline(
        "time", "../project/train/entry_point.py", "-o", "out.sqlite", "--device", "cpu", cwd=elsewhere
    )
    assert result.returncode == 0, result.stderr
    with sqlite3.connect(elsewhere / "out.sqlite") as db:
        files = {row[0] for row in db.execute("SELECT DISTINCT file_path FROM stack_frames")}
    assert "train/helper.py" in files, files


@pytest.mark.slow
def test_an_entry_point_inside_a_package_imports_from_it_as_python_m_would(tmp_path):
    """`python -m train.entry_point` runs a relative import, and an absolute one of the package;
    `python train/entry_point.py` fails both. The analysis runs them, and attributes the lines."""
    project = tmp_path / "project"
    (project / "train").mkdir(parents=True)
    (project / "pyproject.toml").write_text("")
    (project / "train" / "__init__.py").write_text("")
    (project / "train" / "entry_point.py").write_text(
        ENTRY.replace("from helper import loss_of", "from .helper import loss_of\nfrom train.helper import HELPED")
    )
    (project / "train" / "helper.py").write_text(HELPER + "\n\nHELPED = True\n")
    result = run_skyline("time", "train/entry_point.py", "-o", "out.sqlite", "--device", "cpu", cwd=project)
    assert result.returncode == 0, result.stderr
    with sqlite3.connect(project / "out.sqlite") as db:
        files = {row[0] for row in db.execute("SELECT DISTINCT file_path FROM stack_frames")}
    assert {"train/entry_point.py", "train/helper.py"} <= files, files


@pytest.mark.slow
def test_a_missing_entry_point_elsewhere_is_said_missing(tmp_path):
    (tmp_path / "elsewhere").mkdir()
    result = run_skyline(
        "profile", "../nowhere/entry_point.py", "--device", "cpu", "--quiet", cwd=tmp_path / "elsewhere"
    )
    assert result.returncode == 1
    assert "does not exist" in result.stderr, result.stderr
