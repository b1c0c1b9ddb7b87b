"""The measuring processes settle OpenMP's spinning before torch loads (measure/openmp.py), and a
setting of the user's own is left alone: seen from inside the user's code, as torch would see it."""

from __future__ import annotations

import os

import pytest

from conftest import run_skyline
from skyline_engine.service.workers import _worker_environment

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


@pytest.mark.slow
@pytest.mark.parametrize(
    "environment, seen",
    [({}, "10000"), ({"GOMP_SPINCOUNT": "123"}, "123"), ({"OMP_WAIT_POLICY": "PASSIVE"}, "unset")],
)
def test_the_command_line_settles_openmp_unless_the_user_did(tmp_path, monkeypatch, environment, seen):
    for name in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY"):
        monkeypatch.delenv(name, raising=False)
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    (tmp_path / "entry_point.py").write_text(ENTRY)
    result = run_skyline("time", "entry_point.py", "-o", "t.sqlite", "--device", "cpu", "--quiet", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "seen.txt").read_text() == seen


def test_the_services_workers_start_settled(monkeypatch):
    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    assert _worker_environment()["GOMP_SPINCOUNT"] == "10000"
    assert "GOMP_SPINCOUNT" not in os.environ  # the service's own environment is untouched
