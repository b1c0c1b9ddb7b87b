"""Which imports a worker passes on for the next to import ahead (measure/import_ahead.py): the
installed packages' modules only, never the project's own files nor anything else on sys.path,
which the user may be editing; and what the next worker says it imported. Fresh processes: what
a process has imported cannot be undone."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.slow  # fresh processes

SCRIPT = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    from skyline_engine.measure.import_ahead import third_party_imports
    before = set(sys.modules)
    sys.path[:0] = [str(Path("project")), str(Path("elsewhere"))]
    import local_model, vendored  # the project's file; a folder on sys.path
    import pynvim  # an installed package the engine never imports
    import torch.nn  # a package the engine had imported already (torch is)
    print(json.dumps(third_party_imports(before | {"torch"}, Path("project"))))
    """
)


def test_only_installed_packages_modules_are_passed_on(tmp_path):
    for folder, name in (("project", "local_model"), ("elsewhere", "vendored")):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / f"{name}.py").write_text("VALUE = 1\n")
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT], cwd=tmp_path, capture_output=True, text=True, check=True, timeout=120
    )
    names = json.loads(result.stdout)
    assert "pynvim" in names
    assert not {"local_model", "vendored"} & set(names)
    assert not any(name.startswith("torch.") for name in names)  # torch: imported already


AHEAD = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from skyline_engine.measure.import_ahead import import_ahead
    from skyline_engine.measure.runtime import runtime_changes, runtime_note
    Path("project").mkdir()
    Path("project/pynvim_lookalike.py").write_text("raise SystemExit('imported from the project')")
    sys.path.insert(0, "project")
    import_ahead(["pynvim", "pynvim_lookalike", "no_such_module"], Path("project"))
    changes = runtime_changes({}, False)
    print(changes[0])
    print(runtime_note(changes))
    """
)


def test_what_was_imported_ahead_is_said_and_nothing_of_the_projects_is_imported(tmp_path):
    result = subprocess.run(
        [sys.executable, "-c", AHEAD], cwd=tmp_path, capture_output=True, text=True, check=True, timeout=120
    )
    change, note = result.stdout.splitlines()
    assert change.startswith("imported before your code ran: pynvim (")
    assert note.startswith("Imported before your code ran: pynvim") and "os.environ" in note


INSIDE = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    from skyline_engine.measure.import_ahead import InstalledFolders
    project = Path("project").resolve()
    venv = project / ".venv" / "site-packages"
    library = Path("library").resolve()
    folders = [venv, library]
    print(json.dumps([
        InstalledFolders(project, folders).holds(str(venv / "transformers" / "__init__.py")),
        InstalledFolders(project, folders).holds(str(project / "model.py")),
        InstalledFolders(library / "edited", folders).holds(str(library / "edited" / "__init__.py")),
    ]))
    """
)


def test_a_virtual_environment_inside_the_project_is_installed_and_the_project_is_not(tmp_path):
    result = subprocess.run(
        [sys.executable, "-c", INSIDE], cwd=tmp_path, capture_output=True, text=True, check=True, timeout=120
    )
    # A venv in the project (uv's, poetry's, the bench's), the project's own file, and a project
    # that is itself a library inside site-packages, being edited there.
    assert json.loads(result.stdout) == [True, False, False]
