"""Writing files whole or not at all: a reader never sees half an output, a failure leaves none."""

from __future__ import annotations

import json
import os
import stat
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Callable


def write_atomic(path: str | Path, write: Callable[[str], None]) -> None:
    """`write(temporary)` fills a temporary file beside `path`, which is then renamed over `path`
    (atomic on POSIX). The file keeps the permission bits of the one it replaces; a new file gets
    the usual ones (0666 less the umask, 0644 by default), not mkstemp's private 0600.

    As a shell's `>` does, a symbolic link is followed (the file it points to is replaced, the link
    stays), and what is not a regular file (a device such as /dev/null, a FIFO) is written through,
    never replaced: run as root, `--json /dev/null` had replaced the machine's /dev/null."""
    path = Path(os.path.realpath(path))
    if path.exists() and not path.is_file():
        write(str(path))
        return
    mode = path.stat().st_mode & 0o7777 if path.exists() else 0o666 & ~_umask()
    fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent or ".")
    os.close(fd)
    try:
        write(temporary)
        os.chmod(temporary, mode)
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise


def write_text_atomic(path: str | Path, text: str) -> None:
    def write(temporary: str) -> None:
        with open(temporary, "w", encoding="utf-8", newline="") as f:
            f.write(text)
            f.flush()
            if stat.S_ISREG(os.fstat(f.fileno()).st_mode):  # a device or a FIFO written through has no fsync
                os.fsync(f.fileno())

    write_atomic(path, write)


def write_json_atomic(path: str | Path, document: Mapping[str, object]) -> None:
    write_text_atomic(path, json.dumps(document, indent=2, allow_nan=False) + "\n")


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current
