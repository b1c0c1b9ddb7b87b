import multiprocessing.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

# The Neovim fixtures (nvim_session, nvim, project) for every test module that asks for them.
pytest_plugins = ["nvim_helpers"]

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples"


def run_skyline(*args, cwd=REPO, timeout=240) -> subprocess.CompletedProcess:
    """Run the real CLI in a subprocess, as a user would."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.run(
        [sys.executable, "-m", "skyline_engine", *map(str, args)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO


@pytest.fixture
def client(service):
    """The client of a module's `service` fixture (a real `skyline serve --stdio`), checked alive."""
    assert service.alive(), service.log()
    return service.client


# --- slow tests ----------------------------------------------------------------------------------
#
# `slow` marks the tests that start a process (the CLI, the service, Neovim, ranks of distributed
# training) or run a real analysis (the engine timing a training iteration); `bash scripts/dev.sh
# test --fast` runs the others (-m "not slow"). A test is slow when
#   - it uses a fixture that starts Neovim or the service (SLOW_FIXTURES), or
#   - its module says `pytestmark = pytest.mark.slow`, or it is marked `@pytest.mark.slow` itself.
# The marks cannot drift: a test not marked slow that starts a process or runs a training iteration
# in the engine (an analysis does) fails, in every run, saying to mark it. A few tests are marked
# for their cost alone (seconds of real training loops or of fuzzing), the reason beside the mark.

SLOW_FIXTURES = {"nvim_session", "nvim", "service", "client"}


def pytest_collection_modifyitems(items):
    for item in items:
        if SLOW_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


def _refusal(what: str):
    def refuse(*args, **kwargs):
        pytest.fail(f"this test {what}, which makes it slow: mark it `@pytest.mark.slow` (tests/conftest.py)")

    return refuse


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Around a test not marked slow (its fixtures' set-up and teardown included): starting a
    process, or running a training iteration in the engine, fails it."""
    if item.get_closest_marker("slow"):
        yield
        return
    with pytest.MonkeyPatch.context() as patch:
        starts = _refusal("starts a process")
        patch.setattr(subprocess.Popen, "_execute_child", starts)
        patch.setattr(multiprocessing.util, "spawnv_passfds", starts)
        for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp", "system"):
            if hasattr(os, name):
                patch.setattr(os, name, starts)
        # Every analysis, and every test that runs the user's iteration as the engine does, goes
        # through the engine's IterationRunner.
        from skyline_engine.measure.iteration import IterationRunner

        patch.setattr(IterationRunner, "__init__", _refusal("runs a training iteration in the engine"))
        yield
