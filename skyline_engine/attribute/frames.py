"""Where the user's code is right now: the innermost frame of the call stack inside the project."""

from __future__ import annotations

import sys
from types import CodeType, FrameType

from skyline_engine.entry.user_frames import ProjectFiles

# (path relative to the project root, 1-based line)
Context = tuple[str, int]


class CallSites:
    """Finds the call site of the operation running now: the innermost stack frame in a project
    file (torch, site-packages and the engine are skipped), and its line.

    `skip` frames above the caller are not looked at (the engine's own), and a stack shallower
    than that is no error: autograd's device threads run backward with next to no Python frames.
    """

    def __init__(self, files: ProjectFiles) -> None:
        self.files = files
        self._by_filename: dict[str, str | None] = {}

    def innermost(self, skip: int = 1) -> tuple[Context | None, int | None]:
        """The innermost project frame's (path, line), and the identity of that frame."""
        frame = _frame_above(skip + 1)
        while frame is not None:
            relative = self._relative(frame.f_code.co_filename)
            if relative is not None:
                return (relative, frame.f_lineno), id(frame)
            frame = frame.f_back
        return None, None

    def stack(self, skip: int = 1) -> tuple[tuple[Context, ...], int | None]:
        """Every project frame's (path, line), innermost first, and the innermost frame's identity."""
        return self.stack_from(_frame_above(skip + 1))

    def stack_from(self, frame: FrameType | None) -> tuple[tuple[Context, ...], int | None]:
        """`stack` of the frames from `frame` outwards (another thread's, say)."""
        contexts = []
        innermost_id = None
        while frame is not None:
            relative = self._relative(frame.f_code.co_filename)
            if relative is not None:
                if innermost_id is None:
                    innermost_id = id(frame)
                contexts.append((relative, frame.f_lineno))
            frame = frame.f_back
        return tuple(contexts), innermost_id

    def runs_within(self, codes: frozenset[CodeType], skip: int = 1) -> bool:
        """Whether a function of `codes` runs between the caller and the innermost project frame
        (a library method the user's line called, say)."""
        frame = _frame_above(skip + 1)
        while frame is not None and self._relative(frame.f_code.co_filename) is None:
            if frame.f_code in codes:
                return True
            frame = frame.f_back
        return False

    def _relative(self, filename: str) -> str | None:
        try:
            return self._by_filename[filename]
        except KeyError:
            relative = self.files.relative(filename) if self.files.contains(filename) else None
            self._by_filename[filename] = relative
            return relative


def _frame_above(depth: int) -> FrameType | None:
    """The frame `depth` levels above the caller of this function; None when the stack is not
    that deep."""
    try:
        return sys._getframe(depth + 1)
    except ValueError:
        return None
