"""Progress of a command on stderr, while the report waits for stdout.

On a terminal: one live line, `skyline: [ 40%] measuring batch size 64 · 3.2 s`, rewritten in place
(carriage return, the text, clear to the end of the line) at each step and every half second, so
that the elapsed time moves during long steps; it is cut to the terminal's width (a line that
wrapped could no longer be rewritten) and ended with a newline when the command is done, before
the report. Elsewhere (a pipe, a file, an editor, `TERM=dumb`): one plain line per step, as a log
wants them. Hand-formatted: one line needs no terminal library.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Callable, TextIO

from skyline_engine.cli.screen import terminal_columns

# How often the live line's elapsed time is redrawn. The thread that does it sleeps in between and
# holds the interpreter for microseconds when it wakes: the measurements do not see it.
TICK_S = 0.5

CLEAR_TO_END_OF_LINE = "\x1b[K"
FALLBACK_WIDTH = 80


def is_live_terminal(stream: TextIO) -> bool:
    """Whether `stream` is a terminal that can rewrite a line in place."""
    try:
        interactive = stream.isatty()
    except (AttributeError, ValueError):  # closed, or no file behind it
        return False
    return interactive and os.environ.get("TERM", "") != "dumb"


class Progress:
    """The `Progress` callback of an analysis (phase, fraction done) that writes to `stream`."""

    def __init__(
        self,
        stream: TextIO,
        enabled: bool = True,
        live: bool | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.stream = stream
        self.enabled = enabled
        self.live = enabled and (is_live_terminal(stream) if live is None else live)
        self._clock = clock
        self._started = clock()
        self._phase: str | None = None
        self._fraction = 0.0
        self._lock = threading.Lock()  # the ticker and the analysis both write
        self._stopped = threading.Event()
        self._ticker: threading.Thread | None = None

    def __call__(self, phase: str, fraction: float) -> None:
        if not self.enabled or phase == self._phase:
            return
        with self._lock:
            self._phase, self._fraction = phase, fraction
            if self.live:
                self._draw()
            else:
                self._write(self._text() + "\n")
        if self.live and self._ticker is None:
            self._ticker = threading.Thread(target=self._tick, name="skyline-progress", daemon=True)
            self._ticker.start()

    def finish(self) -> None:
        """Stop redrawing; on a terminal, end the live line (its last state stays visible)."""
        self._stopped.set()
        if self._ticker is not None:
            self._ticker.join()
        if self.live and self._phase is not None:
            with self._lock:
                self._draw()
                self._write("\n")

    def elapsed_s(self) -> float:
        return self._clock() - self._started

    def _tick(self) -> None:
        while not self._stopped.wait(TICK_S):
            with self._lock:
                self._draw()

    def _text(self) -> str:
        return f"skyline: [{self._fraction:4.0%}] {self._phase} · {self.elapsed_s():.1f} s"

    def _draw(self) -> None:
        text = self._text()
        width = _width(self.stream) - 1  # the last column would wrap on some terminals
        if len(text) > width:
            text = text[: max(width - 1, 0)] + "…"
        self._write("\r" + text + CLEAR_TO_END_OF_LINE)

    def _write(self, text: str) -> None:
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):  # the terminal went away: progress is not worth an error
            pass


def _width(stream: TextIO) -> int:
    return terminal_columns(stream) or FALLBACK_WIDTH
