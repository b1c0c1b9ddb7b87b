"""The plugin's pure Lua modules, unit by unit, in a real headless Neovim: number formatting, the
batch_size literal locator, the models' formula, option validation and the file-to-buffer line
mapping. Every expected value is written in the cases, worked out by hand, never computed by the
code under test.

The cases are Lua, in tests/lua_units_<module>.lua (StyLua formats them with the plugin's Lua):
each file returns a table of cases, each defined as `function cases.name()`, that raise on a
failed check (tests/lua_units.lua has the checks and the runner). Each case runs here in an
editor of its own, as a test of its own.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
RUNNER = TESTS / "lua_units.lua"
FILES = sorted(TESTS.glob("lua_units_*.lua"))
CASE = re.compile(r"^function cases\.(\w+)\(\)", re.MULTILINE)
RUN = "local runner, path, name = ...; return dofile(runner).run(path, name)"
NAMES = "local runner, path = ...; return dofile(runner).names(path)"


def cases_of(path: Path) -> list[str]:
    """The names of the cases `path` defines, read from its text (no editor at collection)."""
    return CASE.findall(path.read_text(encoding="utf-8"))


@pytest.mark.parametrize(
    "path, name",
    [
        pytest.param(path, name, id=f"{path.stem.removeprefix('lua_units_')}.{name}")
        for path in FILES
        for name in cases_of(path)
    ],
)
def test_lua_unit(nvim, path, name):
    failure = nvim.exec_lua(RUN, str(RUNNER), str(path), name)
    if failure is not None:
        pytest.fail(failure, pytrace=False)


def test_every_case_is_run(nvim):
    """What each file returns is what the text says it defines: a case written another way would
    otherwise never run."""
    assert FILES, "no tests/lua_units_*.lua"
    for path in FILES:
        assert nvim.exec_lua(NAMES, str(RUNNER), str(path)) == sorted(cases_of(path)), path.name
