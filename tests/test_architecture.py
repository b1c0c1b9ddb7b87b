"""The engine's flow runs one way, and the editor's halves stay apart from it.

    entry → measure → attribute → predict → analysis → render | service → cli

Each folder of `skyline_engine` may import only the folders before it (and `errors`; `units`:
how a number reads, which a warning written early needs as much as a renderer; `vocabulary`: the
names of an iteration's parts, which the meters write and the renderers read; `processes`: ending
the processes user code starts, which a worker, a rank and the command line all do); render and
service are peers that never import each other; nothing in the engine imports pynvim, and the
remote plugin never imports the engine. Read from the source with `ast`, so an import inside a
function counts too. And the document's declared shape imports neither torch nor numpy: a reader
of documents needs their shape alone.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
ENGINE = REPO / "skyline_engine"
RPLUGIN = REPO / "rplugin" / "python3" / "skyline_rplugin"

# Rank of each part of the engine: a module may import parts of lower rank, and its own part.
RANKS = {
    "errors": 0,
    "entry": 1,
    "measure": 2,
    "attribute": 3,
    "predict": 4,
    "analysis": 5,
    "render": 6,
    "service": 6,
    "cli": 7,
    "__main__": 8,
}
ALWAYS_ALLOWED = {"skyline_engine", "errors", "units", "vocabulary", "processes"}  # the package (its version),
# errors, number formats, the names of the parts of an iteration, ending the processes user code starts


def part_of(module: str) -> str:
    """`skyline_engine.measure.timing` → `measure`; `skyline_engine` → `skyline_engine`."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def module_name(path: Path) -> str:
    relative = path.relative_to(REPO).with_suffix("")
    parts = list(relative.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(source: str, module: str, is_package: bool = False) -> list[tuple[int, str]]:
    """(line, absolute module) of every import in `module`'s source, relative ones resolved."""
    tree = ast.parse(source)
    package = module if is_package else module.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            found.append((node.lineno, target))
    return found


Module = tuple[str, str, str, bool]  # (path shown, module name, source, is a package)


def modules_in(folder: Path) -> list[Module]:
    return [
        (str(path.relative_to(REPO)), module_name(path), path.read_text(encoding="utf-8"), path.name == "__init__.py")
        for path in sorted(folder.rglob("*.py"))
    ]


def back_arrows(modules: list[Module]) -> list[str]:
    problems = []
    for shown, module, source, is_package in modules:
        source_part = part_of(module)
        if source_part in ALWAYS_ALLOWED:
            continue
        for line, target in imports_of(source, module, is_package):
            if not target.startswith("skyline_engine"):
                continue
            target_part = part_of(target)
            if target_part in ALWAYS_ALLOWED or target_part == source_part:
                continue
            if RANKS[target_part] >= RANKS[source_part]:
                problems.append(f"{shown}:{line}: {source_part} imports {target}")
    return problems


def test_every_engine_part_has_a_rank():
    parts = {part_of(module) for _, module, _, _ in modules_in(ENGINE)} - ALWAYS_ALLOWED
    assert parts <= set(RANKS), f"give these a place in the flow: {parts - set(RANKS)}"


def test_the_engine_flows_one_way():
    assert back_arrows(modules_in(ENGINE)) == []


def test_the_check_finds_back_arrows():
    """The check itself: a measure module importing attribute (inside a function), a service
    module importing render (relatively), and an entry module importing a later part's package."""
    modules = [
        ("m.py", "skyline_engine.measure.m", "def f():\n    from skyline_engine.attribute import recorder\n", False),
        ("s.py", "skyline_engine.service.s", "from ..render import terminal\n", False),
        ("e.py", "skyline_engine.entry", "import skyline_engine.analysis.session\n", True),
        (
            "ok.py",
            "skyline_engine.analysis.ok",
            "from skyline_engine.measure import timing\nfrom . import probing\n",
            False,
        ),
    ]
    assert back_arrows(modules) == [
        "m.py:2: measure imports skyline_engine.attribute",
        "s.py:1: service imports skyline_engine.render",
        "e.py:1: entry imports skyline_engine.analysis.session",
    ]


@pytest.mark.parametrize("folder, forbidden", [(ENGINE, "pynvim"), (RPLUGIN, "skyline_engine")])
def test_the_halves_stay_apart(folder, forbidden):
    offenders = [
        f"{shown}:{line}"
        for shown, module, source, is_package in modules_in(folder)
        for line, target in imports_of(source, module, is_package)
        if target == forbidden or target.startswith(forbidden + ".")
    ]
    assert offenders == []


# Which of torch and numpy a fresh interpreter holds after importing a module.
HEAVY = "import sys, {module}; print(*sorted({{m.split('.')[0] for m in sys.modules}} & {{'torch', 'numpy'}}))"


@pytest.mark.slow  # a fresh interpreter each
@pytest.mark.parametrize(
    "module, heavy",
    [
        ("skyline_engine.analysis.document", ""),  # the shape, and the typed parts named for mypy alone
        ("skyline_engine.analysis.assembly", "numpy torch"),  # the check itself: building one needs both
        # The service reads a result's models and answers `predict` with these (docs/protocol.md).
        ("skyline_engine.predict.batch_models", "numpy"),
        ("skyline_engine.service.worker_messages", ""),
    ],
)
def test_what_reads_documents_imports_only_what_it_needs(module, heavy):
    """Importing analysis/document.py took torch's 1.3 to 2.3 s (and numpy's) when it named the
    measurement types at run time; its shape needs neither. The service's check of a result's
    models imported torch into the service the same way (1.5 s, on its first result)."""
    code = HEAVY.format(module=module)
    command = [sys.executable, "-c", code]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == heavy
