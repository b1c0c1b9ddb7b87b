"""How wide the terminal is that a command writes to."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TextIO


def terminal_columns(stream: TextIO) -> int | None:
    """The columns of the terminal behind `stream`, asked at each call (it may have been resized);
    None when `stream` is not a terminal (a pipe, a file)."""
    try:
        if not stream.isatty():
            return None
        columns = os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, OSError, ValueError):  # closed, or no file behind it
        return None
    return columns if columns > 0 else None


def report_width(stream: TextIO, environ: Mapping[str, str] = os.environ) -> int | None:
    """The width to lay a report out in: `COLUMNS` when set to a number (as Python's
    shutil.get_terminal_size reads it, so that `COLUMNS=80 skyline profile … | less` works), else
    the terminal's; None, no limit, for a pipe or a file."""
    columns = environ.get("COLUMNS", "")
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    return terminal_columns(stream)
