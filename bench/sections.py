"""bench/results.md is written by several scripts: bench/run.py its tables, and each of the others
(bench/distributed.py, bench/compiled.py, bench/profiler_agreement.py,
bench/recorded_iterations.py, bench/memory_growth.py, bench/analysis_parts.py) a section of its own
between two markers. Each keeps what the others wrote: a script replaces only its own section,
and run.py keeps every section."""

from __future__ import annotations

import re
from pathlib import Path

_SECTION = re.compile(r"<!-- (?P<name>[\w-]+): begin -->.*?<!-- (?P=name): end -->", re.DOTALL)


def write_section(path: Path, name: str, title: str, body: str) -> None:
    """Put `body` under `title` between `name`'s markers in `path`, in place of what was there."""
    begin, end = f"<!-- {name}: begin -->", f"<!-- {name}: end -->"
    section = f"{begin}\n## {title}\n\n{body}\n{end}"
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    if begin in text:
        text = text[: text.index(begin)] + section + text[text.index(end) + len(end) :]
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    path.write_text(text, encoding="utf-8")


def with_sections_of(path: Path, text: str) -> str:
    """`text`, followed by the sections the other scripts wrote into `path`."""
    old = path.read_text(encoding="utf-8") if path.exists() else ""
    sections = [match.group(0) for match in _SECTION.finditer(old)]
    return "\n\n".join([text.rstrip("\n"), *sections]) + "\n"
