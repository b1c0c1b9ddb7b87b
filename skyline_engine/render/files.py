"""Writing files whole or not at all: a reader never sees half an output, a failure leaves none."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path


def write_text_atomic(path: str | Path, text: str) -> None:
    """Write to a temporary file beside `path`, then rename it over `path` (atomic on POSIX).

    An existing file keeps its permission bits.
    """
    path = Path(path)
    mode = path.stat().st_mode & 0o7777 if path.exists() else None
    fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent or ".")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        if mode is not None:
            os.chmod(temporary, mode)
        else:
            os.chmod(temporary, 0o666 & ~_umask())
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise


def write_json_atomic(path: str | Path, document: dict) -> None:
    write_text_atomic(path, json.dumps(document, indent=2, allow_nan=False) + "\n")


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current
