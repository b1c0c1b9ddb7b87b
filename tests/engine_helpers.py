"""What the engine's tests share: the timing budgets they analyse with, one analysis of an entry
point on the CPU (`analysed`), and the line of a source that a marker comment points at
(`marked_line`).

A real analysis times the iteration at the user's batch size, and with `predict` at others too:
seconds each even with these budgets, so a test that runs one is marked `slow` (tests/conftest.py).
The budgets are for speed only; no test asserts on how long anything took.
"""

from __future__ import annotations

import re
from pathlib import Path

from skyline_engine.analysis.session import AnalysisRequest, analyze
from skyline_engine.measure.timing import TimingBudget

# The budget of `skyline serve --quick` (QUICK_MIN_RUN_S and QUICK_MAX_RUN_S, cli/serve.py), the
# one the editor's tests profile with: for modules that analyse many entry points, with their
# predictions, and read memory and structure rather than times.
SERVE_QUICK = TimingBudget(min_run_s=0.02, max_run_s=0.2)
# A test's usual analysis: a few blocks of iterations at each batch size.
QUICK = TimingBudget(min_run_s=0.05, max_run_s=0.3)
# The engine's own minimum run (TimingBudget's default min_run_s) with a quarter of its maximum:
# for the line-by-line breakdown's checks and the GPU's.
STEADY = TimingBudget(min_run_s=0.1, max_run_s=0.5)


def analysed(
    project: Path,
    entry: str = "entry_point.py",
    *,
    source: str | None = None,
    budget: TimingBudget = QUICK,
    device: str = "cpu",
    predict: bool = True,
    **request,
) -> dict:
    """The analysis document of `entry` in `project`, from the real engine in this process.

    `source`, when given, is written to the entry point first. `predict` is the engine's own
    default; predict=False skips probing other batch sizes (the breakdown alone: quicker). Other
    keywords are AnalysisRequest's (timeline, world_size, memory_capacity_bytes...).
    """
    if source is not None:
        (Path(project) / entry).write_text(source, encoding="utf-8")
    return analyze(
        AnalysisRequest(entry, Path(project), device=device, budget=budget, predict=predict, **request)
    ).to_dict()


HERE = "# <- HERE"


def marked_line(source: str | Path, marker: str = HERE) -> int:
    """The 1-based number of the one line of `source` (a file, or the text itself) that holds
    `marker`: `# <- HERE` unless told, a comment such as `# LOSS`, or any text (`def forward`).

    The marker must not run on into a name: `# LOSS` does not mark a line of `# LOSS_SCALE`. Lines
    are counted as Python counts them (\\n, \\r\\n or \\r ends one), so the number is the one a
    traceback or the engine gives.
    """
    text = source.read_text(encoding="utf-8") if isinstance(source, Path) else source
    pattern = re.compile(re.escape(marker) + r"(?!\w)")
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    found = [number for number, line in enumerate(lines, start=1) if pattern.search(line)]
    assert len(found) == 1, f"{marker!r} should mark exactly one line of {_name(source)}, found {found}"
    return found[0]


def _name(source: str | Path) -> str:
    return str(source) if isinstance(source, Path) else "the text"
