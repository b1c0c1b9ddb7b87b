"""An in-process stand-in for the engine behind a `Dispatcher`: no workers, no torch.

`FakeEngine.start_job` hands out `FakeJob`s that the test drives by hand (progress, partial,
result, error), so the dispatcher's and the supersession gate's logic can be checked quickly and
fed random input.
"""

from __future__ import annotations

import itertools
from pathlib import Path

from skyline_engine.service.config import ServiceConfig
from skyline_engine.service.dispatcher import Dispatcher

DEVICE = {
    "type": "cpu",
    "index": None,
    "name": "Fake CPU",
    "memory_capacity_bytes": 1 << 34,
    "memory_capacity_source": "physical-memory",
}


class FakeJob:
    def __init__(self, analysis_id: int, request: dict, listener) -> None:
        self.analysis_id = analysis_id
        self.request = request
        self.listener = listener
        self.worker_pid = 4242
        self.started = False
        self.stopped = False

    def start(self) -> None:
        self.started = True

    def stop(self) -> None:
        self.stopped = True


class FakePool:
    def spare_pid(self):
        return None


class FakeEngine:
    def __init__(self, root: str = "/srv/project") -> None:
        self.config = ServiceConfig(project_root=Path(root))
        self.server_root = root
        self.pool = FakePool()
        self.jobs: list[FakeJob] = []
        self.shutdown_requested = False
        self._ids = itertools.count(1)

    def on_close(self, callback):
        return lambda: None

    def device(self):
        return DEVICE, None

    def start_job(self, request, listener, time_limit_s):
        job = FakeJob(next(self._ids), request, listener)
        self.jobs.append(job)
        return job

    def request_shutdown(self):
        self.shutdown_requested = True


class Recorder:
    """A dispatcher's outgoing messages."""

    def __init__(self) -> None:
        self.sent: list = []
        self.on_send = None  # called with each message once it is recorded, as a client reacting to it

    def __call__(self, message: list) -> None:
        self.sent.append(message)
        if self.on_send is not None:
            self.on_send(message)

    def responses(self):
        return [m for m in self.sent if m[0] == 1]

    def notifications(self, method=None):
        return [m[2][0] for m in self.sent if m[0] == 2 and (method is None or m[1] == method)]


def dispatcher(token=None, root="/srv/project"):
    engine, sent = FakeEngine(root), Recorder()
    return Dispatcher(engine, sent, token=token), engine, sent


def document(root="/srv/project", models=True) -> dict:
    """A small complete analysis document with a run-time line 0.1·b + 1 ms."""
    return {
        "schema": "skyline.analysis/1",
        "project_root": root,
        "entry_point": "tiny/entry_point.py",
        "device": DEVICE,
        "batch_size": 16,
        "models": None
        if not models
        else {
            "samples": [{"batch_size": b} for b in (8, 16, 32)],
            "memory_samples": [],
            "run_time_ms": {"slope": 0.1, "bias": 1.0, "r2": 1.0, "max_relative_residual": 0.0, "points": 3},
            "peak_memory_bytes": {
                "slope": 1000.0,
                "bias": 5000.0,
                "r2": 1.0,
                "max_relative_residual": 0.0,
                "points": 3,
                "fitted": "per_operation",
                "phases": [{"name": "forward_backward", "slope": 1000.0, "bias": 5000.0, "r2": 1.0}],
            },
            "memory_headroom_fraction": 0.1,
        },
        "models_withheld": None if models else "Only one batch size could be measured, so nothing is predicted.",
        "warnings": []
        if models
        else [
            "Operations ran 57% slower while recorded.",
            "Only one batch size could be measured, so nothing is predicted.",
        ],
    }
