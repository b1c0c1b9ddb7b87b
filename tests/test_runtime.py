"""The user's program is measured as it runs (measure/runtime.py): the engine changes nothing in
its runtime unless asked (--settle-runtime), and then says so in the document and its warnings.
Seen from inside the user's code, as torch would see it, through the real command line."""

from __future__ import annotations

import json
import os

import pytest

from conftest import run_skyline
from skyline_engine.measure.runtime import SETTLE_RUNTIME
from skyline_engine.service.worker_pool import _worker_environment

ENTRY = """\
import os

import torch

SEEN = os.environ.get("GOMP_SPINCOUNT", "unset")


def skyline_model_provider():
    with open("seen.txt", "w") as f:
        f.write(SEEN)
    return torch.nn.Linear(4, 1)


def skyline_input_provider(batch_size=4):
    return (torch.randn(batch_size, 4),)


def skyline_iteration_provider(model):
    def iteration(x):
        model(x).sum().backward()

    return iteration
"""
PINNED = "glibc malloc thresholds pinned (M_MMAP_THRESHOLD 32 MiB, M_TRIM_THRESHOLD 256 MiB)"


@pytest.fixture
def project(tmp_path, monkeypatch):
    for name in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY", SETTLE_RUNTIME):
        monkeypatch.delenv(name, raising=False)
    (tmp_path / "entry_point.py").write_text(ENTRY)
    return tmp_path


def profiled(project, *options) -> tuple[str, dict]:
    """What the user's code saw of OpenMP's spin, and the document."""
    result = run_skyline(
        "profile",
        "entry_point.py",
        "--json",
        "out.json",
        "--device",
        "cpu",
        "--quiet",
        *options,
        cwd=project,
    )
    assert result.returncode == 0, result.stderr
    return (project / "seen.txt").read_text(), json.loads((project / "out.json").read_text())


@pytest.mark.slow
def test_by_default_nothing_is_changed(project):
    seen, document = profiled(project)
    assert seen == "unset"
    assert document["runtime_changes"] == []
    assert not any("--settle-runtime" in warning for warning in document["warnings"])


@pytest.mark.slow
@pytest.mark.parametrize(
    "environment, seen, changes",
    [
        ({}, "10000", ["GOMP_SPINCOUNT=10000", PINNED]),
        ({"GOMP_SPINCOUNT": "123"}, "123", [PINNED]),  # the user's own setting is theirs
        ({"OMP_WAIT_POLICY": "PASSIVE"}, "unset", [PINNED]),
    ],
)
def test_asked_to_settle_it_says_what_it_changed(project, monkeypatch, environment, seen, changes):
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    seen_there, document = profiled(project, "--settle-runtime")
    assert seen_there == seen
    assert document["runtime_changes"] == changes
    [note] = [warning for warning in document["warnings"] if "--settle-runtime" in warning]
    assert all(change in note for change in changes)


def test_the_services_workers_settle_only_when_the_service_was_asked(monkeypatch):
    for name in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY", SETTLE_RUNTIME):
        monkeypatch.delenv(name, raising=False)
    assert "GOMP_SPINCOUNT" not in _worker_environment()
    assert SETTLE_RUNTIME not in _worker_environment()
    settled = _worker_environment(settle=True)
    assert settled["GOMP_SPINCOUNT"] == "10000"
    assert settled[SETTLE_RUNTIME] == "GOMP_SPINCOUNT"
    assert "GOMP_SPINCOUNT" not in os.environ  # the service's own environment is untouched
