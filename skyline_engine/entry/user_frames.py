"""Finding the user's own frames: which files belong to the project, and where in them an error arose."""

from __future__ import annotations

import os
import re
import sys
import sysconfig
import traceback
from collections.abc import Iterable
from pathlib import Path
from types import FrameType, TracebackType


def _library_roots() -> tuple[str, ...]:
    # A venv inside the project root must not make torch "user code": anything under an
    # installation prefix is library code, wherever that prefix lies.
    paths = sysconfig.get_paths()
    roots = {paths.get(key) for key in ("stdlib", "platstdlib", "purelib", "platlib")}
    roots.update({sys.prefix, sys.base_prefix, sys.exec_prefix})
    return tuple(sorted(os.path.realpath(r) + os.sep for r in roots if r))


# The engine's own frames are never the user's, even when the engine lies inside the project
# root (an editable install in the user's checkout, or this repository's own examples).
_ENGINE_ROOT = os.path.realpath(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) + os.sep
_LIBRARY_ROOTS = (*_library_roots(), _ENGINE_ROOT)


class ProjectFiles:
    """Decides whether a source file is the user's (inside the project root, not an installed library)."""

    def __init__(self, project_root: str | Path) -> None:
        self.root = os.path.realpath(project_root)
        self._prefix = self.root + os.sep
        self._cache: dict[str, bool] = {}

    def contains(self, filename: str) -> bool:
        known = self._cache.get(filename)
        if known is None and (filename.startswith(("<", *_LIBRARY_ROOTS))):
            # Pseudo-files (`<frozen runpy>`, `<string>`) are no files at all; realpath would
            # resolve them against the working directory, often the project root. Library files
            # are told by name, without realpath's system calls (thousands of torch modules).
            known = self._cache[filename] = False
        if known is None:
            real = os.path.realpath(filename)
            known = (
                real.startswith(self._prefix) and not real.startswith(_LIBRARY_ROOTS) and ("site-packages" not in real)
            )
            self._cache[filename] = known
        return known

    def relative(self, filename: str) -> str:
        return os.path.relpath(os.path.realpath(filename), self.root)

    def loaded(self) -> list[str]:
        """The project's files among the modules imported in this process (thousands, with torch),
        relative to the root, sorted."""
        filenames = {getattr(module, "__file__", None) for module in list(sys.modules.values())}
        # Absolute names only: torch.ops and torch.classes name "_ops.py" and "_classes.py", which
        # would resolve against the working directory, often the project root.
        return sorted(
            {self.relative(f) for f in filenames if isinstance(f, str) and os.path.isabs(f) and self.contains(f)}
        )


def innermost_user_frame(tb: TracebackType | None, files: ProjectFiles) -> traceback.FrameSummary | None:
    """The deepest frame of a traceback that lies in a project file."""
    return _innermost(traceback.extract_tb(tb), files)


def innermost_user_frame_of_stack(frame: FrameType | None, files: ProjectFiles) -> traceback.FrameSummary | None:
    """The deepest frame in a project file of the stack that `frame` tops (a signal handler's
    `frame`: where the code was when the signal came)."""
    return _innermost(traceback.extract_stack(frame), files)


def _innermost(frames: traceback.StackSummary, files: ProjectFiles) -> traceback.FrameSummary | None:
    """The last of `frames` (outermost first) that lies in a project file."""
    found = None
    for frame in frames:
        if files.contains(frame.filename):
            found = frame
    return found


def user_traceback_text(tb: TracebackType | None, files: ProjectFiles, limit: int = 6) -> str:
    """The user's frames of a traceback, innermost last, as `path:line in function: source`."""
    frames = [f for f in traceback.extract_tb(tb) if files.contains(f.filename)][-limit:]
    lines = []
    for f in frames:
        source = f" | {f.line.strip()}" if f.line else ""
        lines.append(f"  {files.relative(f.filename)}:{f.lineno} in {f.name}{source}")
    return "\n".join(lines)


_FRAME = re.compile(r'^\s*File "(?P<file>.+)", line (?P<line>\d+) in (?P<function>.*)$')
_THREAD = re.compile(r"^(Current thread|Thread) 0x[0-9a-fA-F]+")


def user_frame_in_faulthandler_dump(lines: Iterable[str], project_root: str) -> tuple[str | None, int | None]:
    """The user's innermost frame in the last faulthandler dump among `lines` (a crashed worker's
    stderr, a rank's fault file), as (path, line) relative to the project root; (None, None) when
    there is none."""
    files = ProjectFiles(project_root)
    for frames in _last_dump(list(lines)):
        for filename, line in frames:  # most recent call first
            if files.contains(filename):
                return files.relative(filename), line
    return None, None


def _last_dump(lines: list[str]) -> list[list[tuple[str, int]]]:
    """The frames of each thread in the last dump, the current thread's first."""
    threads: list[tuple[bool, list[tuple[str, int]]]] = []
    previous_was_dump = False
    for line in lines:
        header = _THREAD.match(line)
        frame = _FRAME.match(line)
        if header:
            if not previous_was_dump:
                threads = []  # a new dump begins
            threads.append((line.startswith("Current"), []))
            previous_was_dump = True
        elif frame and threads:
            threads[-1][1].append((frame.group("file"), int(frame.group("line"))))
            previous_was_dump = True
        elif line.strip():
            previous_was_dump = False  # blank lines separate a dump's threads; other text ends it
    threads.sort(key=lambda thread: not thread[0])
    return [frames for _, frames in threads]
