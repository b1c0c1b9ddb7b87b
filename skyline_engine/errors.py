"""Errors the engine reports to people: one paragraph, with the file and line where there is one."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class SkylineError(Exception):
    """A problem the user can act on.

    `path` is relative to the project root where the file lies inside it, `line` is 1-based.
    `hint` says what to write or do instead.
    """

    message: str
    path: str | None = None
    line: int | None = None
    hint: str | None = None

    def __post_init__(self) -> None:
        super().__init__(self.message)

    def __str__(self) -> str:
        return self.format()

    def format(self) -> str:
        where = ""
        if self.path is not None:
            where = f"{self.path}:{self.line}: " if self.line is not None else f"{self.path}: "
        text = where + self.message
        if self.hint:
            text += " " + self.hint
        return text

    def to_dict(self) -> dict[str, Any]:
        return {"message": self.format(), "path": self.path, "line": self.line}


class EntryPointError(SkylineError):
    """The entry point breaks Skyline's provider contract."""


@dataclass
class UserCodeError(SkylineError):
    """The user's own code raised; `path`/`line` name the user's innermost frame; `batch_size` is
    the batch size the training iteration ran at when it was the iteration that raised."""

    batch_size: int | None = None


class OutOfMemory(SkylineError):
    """The device ran out of memory at some batch size."""
