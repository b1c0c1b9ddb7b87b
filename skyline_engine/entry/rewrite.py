"""Rewriting the `batch_size` default in the entry point file (`skyline profile --set-batch-size`).

The literal is replaced in the file's bytes, not in its decoded text written back: a BOM and the
encoding the file declares (PEP 263) stay as they are, and so does every other byte. The file is
written in place, from the literal on.
"""

from __future__ import annotations

import os
from pathlib import Path

from skyline_engine.entry.batch_size import literal_span, rewrite_batch_size
from skyline_engine.entry.loader import decode_source, source_encoding
from skyline_engine.entry.user_frames import ProjectFiles
from skyline_engine.errors import SkylineError


def set_batch_size_default(path: Path, project_root: Path, batch_size: int) -> None:
    """Rewrite the `batch_size` default of the entry point at `path`."""
    relative = ProjectFiles(project_root).relative(str(path))
    with open(path, "r+b") as f:
        data = f.read()
        source = decode_source(data, relative)
        try:
            first, last = literal_span(source, batch_size, relative)
        except SyntaxError as exc:
            raise SkylineError(f"syntax error: {exc.msg}.", path=relative, line=exc.lineno) from None
        start = _byte_offset(data, source, first, relative)
        end = _byte_offset(data, source, last, relative)
        rewritten = data[:start] + str(batch_size).encode("ascii") + data[end:]
        if decode_source(rewritten, relative) != rewrite_batch_size(source, batch_size, relative):
            # Not expected: digits are ASCII bytes in every encoding Python reads source in.
            raise SkylineError("cannot find the batch size's digits among the file's bytes.", path=relative)
        if rewritten != data:
            f.seek(start)
            f.write(rewritten[start:])
            f.truncate()
            f.flush()
            os.fsync(f.fileno())


def _byte_offset(data: bytes, text: str, index: int, relative: str) -> int:
    """The offset in the file's bytes of character `index` of its decoded `text`: after the BOM,
    in the file's own encoding."""
    encoding = source_encoding(data, relative)
    if encoding == "utf-8-sig":
        return len(b"\xef\xbb\xbf") + len(text[:index].encode("utf-8"))
    return len(text[:index].encode(encoding))
