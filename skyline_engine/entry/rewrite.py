"""Rewriting the batch size's literal in the user's file (`skyline profile --set-batch-size`): an
entry point's `batch_size` default, or a training script's (entry/script_batch_size.py).

Three things make it safe for the user's file:

- The definition that ran: an entry point is imported first, and the default rewritten is that
  of the `skyline_input_provider` its module holds (`EntryPoint.input_provider_code`), not the
  last one in the file. A script is not run first (that would train): its literal must be the
  only one of its kind (`literal_to_set`).
- The file as it was read (imported, for an entry point): the bytes are read again and decoded
  right before the write, and the write happens only when they are still the text that was read;
  a file changed meanwhile (an editor saving it, a tool appending) is read again, up to ATTEMPTS
  times, and then left alone with a message, rather than overwritten with a stale copy that loses
  the other change.
- A file another program is writing: one modified within the last QUIET_S is not rewritten until
  it has been left alone that long (within the attempts). Between the last check and the write
  lie a few system calls, and bytes appended in that instant to a file whose literal changes
  length would be overwritten or cut: a program appending every millisecond hit that window
  within a second on a fast machine. A quiet spell first makes it one append in microseconds
  after a pause.
- The file itself: it is written in place, from the literal on, never replaced by a new file, so
  hard links, owner, permissions and anything watching the inode stay as they were. Only the
  bytes from the literal to the end are written (the literal alone when the length is the same).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Callable

from skyline_engine.entry.batch_size import check_new_batch_size, literal_span, location_span
from skyline_engine.entry.loader import decode_source, load_entry_point, read_source, source_encoding
from skyline_engine.entry.script_batch_size import literal_to_set
from skyline_engine.errors import SkylineError

ATTEMPTS = 3
# A file modified more recently than this is being written by another program: wait for quiet.
QUIET_S = 0.05


class FileChanged(SkylineError):
    """The file changed between the read and the write; nothing was written."""


# Where the literal lies in the file as it was read: (the file's path relative to the project
# root, its source, the literal's character span).
Literal = Callable[[], tuple[str, str, tuple[int, int]]]


def set_batch_size_default(path: Path, project_root: Path, batch_size: int) -> None:
    """Rewrite the `batch_size` default of the input provider that `path`'s module holds."""

    def literal() -> tuple[str, str, tuple[int, int]]:
        entry = load_entry_point(path, project_root)  # which definition runs is known only by running it
        try:
            code = entry.input_provider_code()
        finally:
            entry.unload()
        return entry.relative_path, entry.source, literal_span(entry.source, batch_size, entry.relative_path, code)

    _rewrite(path, batch_size, literal)


def set_script_batch_size(path: Path, project_root: Path, batch_size: int, argv: tuple[str, ...]) -> None:
    """Rewrite the literal that sets the training script's batch size (`literal_to_set`), the
    script run with `argv`."""
    relative = str(path.resolve().relative_to(project_root))
    check_new_batch_size(batch_size)

    def literal() -> tuple[str, str, tuple[int, int]]:
        source = read_source(path, relative)
        return relative, source, location_span(source, literal_to_set(source, relative, argv))

    _rewrite(path, batch_size, literal)


def _rewrite(path: Path, batch_size: int, literal: Literal) -> None:
    for attempt in range(1, ATTEMPTS + 1):
        try:
            _rewrite_once(path, batch_size, literal)
            return
        except FileChanged:
            if attempt == ATTEMPTS:
                raise
            time.sleep(QUIET_S)


def _rewrite_once(path: Path, batch_size: int, literal: Literal) -> None:
    relative, source, (first, last) = literal()
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError as exc:
        raise SkylineError(f"cannot write the batch size into the file: {exc.strerror}.", path=relative) from None
    try:
        if time.time() - os.fstat(fd).st_mtime < QUIET_S:
            raise _changed(relative, "moments ago, and may still be changing")
        data = _read_all(fd)
        if decode_source(data, relative) != source:
            raise _changed(relative, "while Skyline read it")
        encoding = source_encoding(data, relative)
        start = _byte_offset(source, first, encoding)
        end = _byte_offset(source, last, encoding)
        digits = str(batch_size).encode("ascii")
        rewritten = data[:start] + digits + data[end:]
        if decode_source(rewritten, relative) != source[:first] + str(batch_size) + source[last:]:
            # Not expected: digits are ASCII bytes in every encoding Python reads source in.
            raise SkylineError("cannot find the batch size's digits among the file's bytes.", path=relative)
        if rewritten != data:
            _write_in_place(fd, data, rewritten, start, start + len(digits), relative)
    finally:
        os.close(fd)


def _byte_offset(text: str, index: int, encoding: str) -> int:
    """The offset in the file's bytes of character `index` of its decoded `text`, in the file's own
    `encoding` (`utf-8-sig` writes the BOM first, as the file has it)."""
    return len(text[:index].encode(encoding))


def _write_in_place(fd: int, expected: bytes, rewritten: bytes, start: int, end: int, relative: str) -> None:
    """Write `rewritten` over the file, which must still hold `expected`. They differ from `start`
    on: only the new literal (`start` to `end`) is written when the length is the same, else
    everything from it on, and the file is cut where `rewritten` ends when that is shorter.

    A change by another program is looked for right before (nothing is written then) and right
    after (the message says to check the file). Between the check and the write lie a few system
    calls: bytes appended in that instant to a file whose literal changes length can still be
    overwritten (longer) or cut (shorter); an equal length writes the literal's bytes alone."""
    if _read_all(fd) != expected:
        raise _changed(relative, "while Skyline rewrote its batch size")
    if len(rewritten) == len(expected):
        os.pwrite(fd, rewritten[start:end], start)
    else:
        os.pwrite(fd, rewritten[start:], start)
        if len(rewritten) < len(expected):
            os.ftruncate(fd, len(rewritten))
    os.fsync(fd)
    if not _read_all(fd).startswith(rewritten):
        raise SkylineError(
            "another program wrote to the file while Skyline rewrote its batch size; check it.",
            path=relative,
        )


def _read_all(fd: int) -> bytes:
    chunks = []
    offset = 0
    while chunk := os.pread(fd, 1 << 20, offset):
        chunks.append(chunk)
        offset += len(chunk)
    return b"".join(chunks)


def _changed(relative: str, when: str) -> FileChanged:
    return FileChanged(
        f"the file changed {when} (another program wrote to it); nothing was written.",
        path=relative,
        hint="Run the command again.",
    )
