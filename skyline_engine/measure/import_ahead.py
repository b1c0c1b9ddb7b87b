"""The installed libraries the user's code imports, imported ahead by the service's next worker.

Each analysis runs in a fresh worker, so that edits are always picked up; the service keeps one
started ahead with torch imported. A project that imports `transformers` paid for that import
(0.7 to 4 s on a 2-core machine) at every save: a tiny BERT built from its config answered a
save with its first per-line result in 0.75 s, and in 0.08 s with its imports made ahead. So a
worker that ends its analysis names the modules the user's code imported from installed
packages (`third_party_imports`: files under the interpreter's site-packages, a virtual
environment's inside the project included; never the project's own files, nor anything found on
PYTHONPATH or added to sys.path, which the user may be editing), and the service's next spare
worker imports them while it waits for its job (`import_ahead`), within IMPORT_AHEAD_S.

Importing earlier can change what a library sees: a script that sets an environment variable
before `import transformers` (HF_HOME, TRANSFORMERS_OFFLINE) must be imported as it runs. So a
worker whose analysis changed os.environ names none, and the document says, in
`runtime_changes`, what was imported ahead.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import site
import sys
import sysconfig
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path

# How many module names a worker passes on, and how long the next one spends importing them.
MAX_MODULES = 2000
IMPORT_AHEAD_S = 30.0
# The start of the document's `runtime_changes` item that says what was imported ahead, and how
# many packages it names (transformers brings a dozen of its own).
IMPORTED_AHEAD = "imported before your code ran"
NAMED_PACKAGES = 5


@dataclass
class _Ahead:
    """What this process imported ahead (`import_ahead`), for its document."""

    names: tuple[str, ...] = ()
    seconds: float = 0.0


_ahead = _Ahead()


def installed_package_folders() -> list[Path]:
    """Where installed packages live: the interpreter's site-packages (a virtual environment's
    included), the user's own."""
    paths = {sysconfig.get_paths()[key] for key in ("purelib", "platlib")}
    paths.update(getattr(site, "getsitepackages", list)())
    user = site.getusersitepackages() if site.ENABLE_USER_SITE else None
    if isinstance(user, str):
        paths.add(user)
    return [Path(path).resolve() for path in paths]


def third_party_imports(before: Collection[str], project_root: Path) -> list[str]:
    """The modules imported since `before` (the names in sys.modules then) whose files are in an
    installed package (`InstalledFolders`: not the project's own), in the order they were imported
    (MAX_MODULES at most); none of a package already imported then (torch's modules that load
    lazily are the engine's as much as the user's)."""
    installed = InstalledFolders(project_root)
    packages_before = {name.split(".")[0] for name in before}
    names = []
    for name, module in list(sys.modules.items()):
        new = name not in before and name.split(".")[0] not in packages_before
        file = getattr(module, "__file__", None) if new else None
        if isinstance(file, str) and installed.holds(file):
            names.append(name)
            if len(names) == MAX_MODULES:
                break
    return names


def import_ahead(names: Sequence[str], project_root: Path, budget_s: float = IMPORT_AHEAD_S) -> None:
    """Import `names`, in order, until `budget_s` is spent: each only where its top-level package
    is installed (the names come from another process, which the user's code ran in); what fails
    to import is left to the user's code, which imports it again and meets the error itself."""
    installed = InstalledFolders(project_root)
    started = time.perf_counter()
    imported = []
    for name in names:
        if time.perf_counter() - started > budget_s:
            break
        if not _package_installed(name.split(".")[0], installed):
            continue
        try:
            importlib.import_module(name)
        except (Exception, SystemExit):  # noqa: BLE001 - the user's code imports it again, as it runs
            continue
        imported.append(name)
    _ahead.names, _ahead.seconds = tuple(imported), time.perf_counter() - started


def _package_installed(top: str, installed: InstalledFolders) -> bool:
    """Whether the top-level module `top` is found (not imported) in an installed package."""
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return False
    if spec is None:
        return False
    where = spec.origin or next(iter(spec.submodule_search_locations or ()), None)
    return isinstance(where, str) and installed.holds(where)


class InstalledFolders:
    """Whether a file is an installed package's: under a site-packages folder (a virtual
    environment inside the project's is one: the bench's `.venv`, uv's and poetry's), unless the
    project itself is inside that folder (a library being edited where it is installed). The
    project's own package installed in editable mode lives in the project, not there. Decided once
    per directory: a package's modules share theirs (transformers' 488 modules took 27 ms to check
    one by one, on the way to the analysis's result)."""

    def __init__(self, project_root: Path, folders: list[Path] | None = None) -> None:
        root = project_root.resolve()
        self.folders = [
            folder for folder in folders or installed_package_folders() if folder != root and folder not in root.parents
        ]
        self._verdicts: dict[str, bool] = {}

    def holds(self, file: str) -> bool:
        directory = os.path.dirname(file)
        verdict = self._verdicts.get(directory)
        if verdict is None:
            real = Path(directory).resolve()
            verdict = any(folder == real or folder in real.parents for folder in self.folders)
            self._verdicts[directory] = verdict
        return verdict


def imported_ahead() -> str | None:
    """The `runtime_changes` item for what this process imported ahead, or None: the packages
    (top-level names), how many modules, and how long it took."""
    if not _ahead.names:
        return None
    packages = list(dict.fromkeys(name.split(".")[0] for name in _ahead.names))
    named = ", ".join(packages[:NAMED_PACKAGES]) + (
        f" and {len(packages) - NAMED_PACKAGES} more" if len(packages) > NAMED_PACKAGES else ""
    )
    return (
        f"{IMPORTED_AHEAD}: {named} ({len(_ahead.names)} modules, {_ahead.seconds:.1f} s, while the service "
        "waited for this analysis: the last analysis's imports from installed packages)"
    )
