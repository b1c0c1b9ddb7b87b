"""The project root the command line takes when none is given.

The working directory, when the entry point lies inside it (Skyline's own convention: run from the
project's folder). Otherwise the root the editor would find for it: the nearest folder above the
entry point that holds a root marker, else the entry point's own folder; so `skyline profile
~/src/model/train_entry.py` works from anywhere. The service never guesses: its clients may only
reach the root it was started with.
"""

from __future__ import annotations

from pathlib import Path

# The editor's default `root_markers` (lua/skyline/config.lua); tests/test_project_root.py keeps them equal.
ROOT_MARKERS = (".git", "pyproject.toml", "setup.py", "setup.cfg")


def default_project_root(entry: str, cwd: Path) -> Path:
    path = (cwd / entry).resolve()
    if path.is_relative_to(cwd.resolve()):
        return cwd
    folder = next((parent for parent in path.parents if parent.is_dir()), cwd)  # a missing path: its nearest folder
    for candidate in (folder, *folder.parents):
        if any((candidate / marker).exists() for marker in ROOT_MARKERS):
            return candidate
    return folder
