"""What the user's code was, as a digest a later analysis can compare against: each project file
the analysis ran (the entry point and every module of the project it imported), hashed, with the
entry point's batch-size literal left out — the batch-size keys change that literal and nothing
else, and the other batch sizes' memory does not depend on it.

A file read as data (a config the model is built from) is not among them; what reuses a previous
analysis's findings checks them against the iteration measured now as well
(analysis/known_memory.py).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from pathlib import Path

from skyline_engine.entry.batch_size import BatchSizeLocation

# Hashes per project file, keyed by its path relative to the project root.
CodeDigest = dict[str, str]


def code_digest(root: Path, paths: Iterable[str], literal: BatchSizeLocation | None) -> CodeDigest | None:
    """The digest of `paths` (relative to `root`) as they are now, `literal`'s digits left out
    where it can be rewritten; None when one of them is not a file that can be read (a device
    such as /dev/zero would be read for ever)."""
    digest = {}
    for path in sorted(set(paths)):
        try:
            if not (root / path).is_file():
                return None
            data = (root / path).read_bytes()
        except OSError:
            return None
        if literal is not None and literal.editable and literal.path == path:
            data = _without_literal(data, literal)
        digest[path] = hashlib.sha256(data).hexdigest()
    return digest


def _without_literal(data: bytes, literal: BatchSizeLocation) -> bytes:
    """`data` with the bytes at `literal` (a line, byte columns) taken out."""
    lines = data.split(b"\n")
    index = literal.line - 1
    if 0 <= index < len(lines):
        line = lines[index]
        lines[index] = line[: literal.col_start] + line[literal.col_end :]
    return b"\n".join(lines)
