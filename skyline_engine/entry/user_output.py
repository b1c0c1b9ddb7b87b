"""What the user's code prints while it is analysed: the first lines, then a count.

A training loop turned into an iteration often keeps its `print(loss)`; Skyline runs the iteration
thousands of times (a tiny model: 68,143 lines on the terminal before the report, which scrolled
away). While an analysis runs, `sys.stdout` and `sys.stderr` show the first SHOWN_LINES lines
each and count the rest, which the document's warnings then mention. Writes to the file
descriptors themselves (C code, subprocesses: the streams give theirs, `fileno()`) and handlers
that kept the original streams (a `logging` handler made before the analysis) are not seen; bytes
written to `sys.stdout.buffer` are, as text.
"""

from __future__ import annotations

import codecs
import contextlib
import io
import sys
from collections.abc import Iterator
from typing import Any, TextIO

SHOWN_LINES = 20


class _FirstLines(io.TextIOBase):
    """A text stream that passes on the first `shown` lines to `target` and counts the others."""

    def __init__(self, target: TextIO, shown: int) -> None:
        super().__init__()
        self.target = target
        self.shown = shown
        self.lines = 0  # complete lines written, shown or not
        self._partial = False  # the last write left a line unfinished
        self._bytes: _Bytes | None = None

    @property
    def hidden(self) -> int:
        """Lines written beyond the shown ones (an unfinished last one counts)."""
        return max(0, self.lines + self._partial - self.shown)

    @property
    def encoding(self) -> str:  # type: ignore[override]  # print() and libraries ask
        return getattr(self.target, "encoding", None) or "utf-8"

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        if self.lines < self.shown:
            room = self.shown - self.lines
            pieces = text.split("\n")
            self.target.write("\n".join(pieces[:room]) + ("\n" if len(pieces) > room else ""))
        self.lines += text.count("\n")
        if text:
            self._partial = not text.endswith("\n")
        return len(text)

    def flush(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            self.target.flush()

    def fileno(self) -> int:
        # Code that hands the stream to C or to a subprocess (`faulthandler.enable()`,
        # `subprocess.run(cmd, stdout=sys.stdout)`) writes to the descriptor itself: passed on,
        # not counted (the module says so). Without it, that valid code raised `fileno`.
        return self.target.fileno()

    def isatty(self) -> bool:
        with contextlib.suppress(OSError, ValueError, AttributeError):
            return bool(self.target.isatty())
        return False

    @property
    def buffer(self) -> _Bytes:
        """The binary side, as a real text stream has one (`sys.stdout.buffer.write(b"...")`)."""
        if self._bytes is None:
            self._bytes = _Bytes(self)
        return self._bytes


class _Bytes(io.RawIOBase):
    """Bytes written to a `_FirstLines`, decoded as its encoding says (a character split between
    two writes is decoded whole) and counted as its text is."""

    def __init__(self, text: _FirstLines) -> None:
        super().__init__()
        self.text = text
        self._decoder = codecs.getincrementaldecoder(text.encoding)("replace")

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        raw = bytes(data)
        self.text.write(self._decoder.decode(raw))
        return len(raw)

    def flush(self) -> None:
        self.text.flush()


class UserOutput:
    """How much of the user's output was hidden, once the analysis is over."""

    def __init__(self, stdout: _FirstLines, stderr: _FirstLines) -> None:
        self._streams = (stdout, stderr)

    @property
    def hidden_lines(self) -> int:
        return sum(stream.hidden for stream in self._streams)

    def note(self) -> str | None:
        """The warning that says what was hidden; None when nothing was."""
        hidden = self.hidden_lines
        if not hidden:
            return None
        return (
            f"Your code printed {hidden:,} more lines while it was measured, beyond the first {SHOWN_LINES} of "
            "stdout and of stderr, which were passed on (Skyline runs the iteration many times); writing them is "
            "left out of the times. Print from the iteration only where it helps, or guard it "
            "(`if step % 100 == 0:`)."
        )


@contextlib.contextmanager
def first_lines_of_user_output(shown: int = SHOWN_LINES) -> Iterator[UserOutput]:
    stdout, stderr = _FirstLines(sys.stdout, shown), _FirstLines(sys.stderr, shown)
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        try:
            yield UserOutput(stdout, stderr)
        finally:
            stdout.flush()
            stderr.flush()
