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
