"""Rewriting the `batch_size` default in the entry point file (`skyline profile --set-batch-size`).

The default rewritten is that of the definition that ran: the entry point is imported first, and
the `skyline_input_provider` its module holds (`EntryPoint.input_provider_code`) says which `def`
it is, not the last one in the file. The literal is replaced in the file's bytes, not in its
decoded text written back: a BOM and the encoding the file declares (PEP 263) stay as they are,
and so does every other byte. The file is written in place, from the literal on.
"""

from __future__ import annotations

import os
from pathlib import Path

from skyline_engine.entry.batch_size import literal_span, rewrite_batch_size
from skyline_engine.entry.loader import decode_source, load_entry_point, source_encoding
from skyline_engine.errors import SkylineError


def set_batch_size_default(path: Path, project_root: Path, batch_size: int) -> None:
    """Rewrite the `batch_size` default of the input provider that `path`'s module holds."""
    entry = load_entry_point(path, project_root)  # which definition runs is known only by running it
    try:
        code = entry.input_provider_code()
    finally:
        entry.unload()
    relative, source = entry.relative_path, entry.source
    with open(path, "r+b") as f:
        data = f.read()
        first, last = literal_span(source, batch_size, relative, code)
        start = _byte_offset(data, source, first, relative)
        end = _byte_offset(data, source, last, relative)
        rewritten = data[:start] + str(batch_size).encode("ascii") + data[end:]
        if decode_source(rewritten, relative) != rewrite_batch_size(source, batch_size, relative, code):
            # The file changed since it was imported, or (not expected: digits are ASCII bytes in
            # every encoding Python reads source in) the literal's bytes are not where they should be.
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
