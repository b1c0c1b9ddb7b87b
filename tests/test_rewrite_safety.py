"""`skyline profile --set-batch-size N` and the user's file (#12 items 9 and 10): the default
rewritten is that of the definition that ran, a file changed meanwhile is never overwritten with
a stale copy, and the file stays the same file (hard links, permissions).

The tests call the function the command line runs before its analysis, on real files, with the
real loader importing the entry point; a second process appends to the file concurrently.
"""

from __future__ import annotations

import itertools
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from engine_helpers import SERVE_QUICK, analysed
from skyline_engine.cli import _set_entry_point_batch_size  # what `skyline profile --set-batch-size N` runs first
from skyline_engine.entry.rewrite import ATTEMPTS, FileChanged, _write_in_place
from skyline_engine.errors import SkylineError

ENTRY = "entry_point.py"

HEAD = """\
import functools

import torch


def skyline_model_provider():
    return torch.nn.Linear(2, 1)


def skyline_iteration_provider(model):
    def iteration(x):
        model(x).sum().backward()

    return iteration

"""


def write_entry(root: Path, providers: str) -> Path:
    path = root / ENTRY
    path.write_text(HEAD + providers)
    return path


def set_batch_size(root: Path, batch_size: int) -> None:
    assert _set_entry_point_batch_size(ENTRY, root, root, batch_size)


def defaults(path: Path) -> list[str]:
    """Every `batch_size=` default in the file, in order."""
    return re.findall(r"batch_size=(\w+)", path.read_text())


# --- the definition that ran (item 9) --------------------------------------------------------

IF_ELSE = """
SMALL = True
if SMALL:
    def skyline_input_provider(batch_size=8):
        return (torch.randn(batch_size, 2),)
else:
    def skyline_input_provider(batch_size=64):
        return (torch.randn(batch_size, 2),)
"""


@pytest.mark.parametrize(
    "providers, before, after",
    [
        pytest.param(
            IF_ELSE,
            ["8", "64"],
            ["4", "64"],
            id="if-else",
        ),
        pytest.param(
            """
try:
    import json  # present: the `try` branch's definition runs
    def skyline_input_provider(batch_size=16):
        return (torch.randn(batch_size, 2),)
except ImportError:
    def skyline_input_provider(batch_size=32):
        return (torch.randn(batch_size, 2),)
""",
            ["16", "32"],
            ["4", "32"],
            id="try-except",
        ),
        pytest.param(
            """
def skyline_input_provider(batch_size=8):
    return (torch.randn(batch_size, 2),)


_first = skyline_input_provider


def skyline_input_provider(batch_size=128):  # replaced below: this one never runs
    return (torch.randn(batch_size, 2),)


skyline_input_provider = _first
""",
            ["8", "128"],
            ["4", "128"],
            id="later-redefinition",
        ),
        pytest.param(
            """
def skyline_input_provider(batch_size=8):
    return (torch.randn(batch_size, 2),)


@functools.lru_cache()
def skyline_input_provider(batch_size=24):
    return (torch.randn(batch_size, 2),)
""",
            ["8", "24"],
            ["8", "4"],
            id="decorated-last",
        ),
    ],
)
def test_the_default_rewritten_is_that_of_the_definition_that_ran(tmp_path, providers, before, after):
    path = write_entry(tmp_path, providers)
    assert defaults(path) == before
    set_batch_size(tmp_path, 4)
    assert defaults(path) == after


@pytest.mark.slow
def test_the_analysis_locates_the_default_of_the_definition_that_ran(tmp_path):
    """The editor's batch-size keys edit where the document's `batch_size_location` says."""
    path = write_entry(tmp_path, IF_ELSE)
    document = analysed(tmp_path, ENTRY, budget=SERVE_QUICK, predict=False)
    location = document["batch_size_location"]
    line = path.read_text().split("\n")[location["line"] - 1]
    assert (location["value"], line.encode()[location["col_start"] : location["col_end"]]) == (8, b"8")
    assert "batch_size=8" in line


@pytest.mark.parametrize(
    "providers, files, says",
    [
        pytest.param(
            """
def _inputs(batch_size=8, scale=1):
    return (scale * torch.randn(batch_size, 2),)


skyline_input_provider = functools.partial(_inputs, scale=2)
""",
            {},
            "it is a partial, not a function defined with `def`",
            id="partial",
        ),
        pytest.param(
            "from inputs import skyline_input_provider\n",
            {
                "inputs.py": "import torch\n\n\ndef skyline_input_provider(batch_size=8):\n"
                "    return (torch.randn(batch_size, 2),)\n"
            },
            "it is defined in inputs.py, not in this file",
            id="another-file",
        ),
    ],
)
def test_a_definition_that_cannot_be_known_is_refused_naming_the_file(tmp_path, providers, files, says):
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    path = write_entry(tmp_path, providers)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()}
    with pytest.raises(SkylineError) as caught:
        set_batch_size(tmp_path, 4)
    error = caught.value
    assert error.path == ENTRY
    assert "cannot tell which definition of `skyline_input_provider`" in error.message
    assert says in error.message
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()} == before
    assert path.read_bytes() == before[ENTRY]


# --- concurrent edits and the file itself (item 10) ------------------------------------------

INPUT_PROVIDER = """
def skyline_input_provider(batch_size=8):
    return (torch.randn(batch_size, 2),)
"""

# Appends numbered lines to the file, opening it for each, as a tool or an editor saving would.
APPENDER = """
import sys
import time

path, count = sys.argv[1], int(sys.argv[2])
for number in range(count):
    with open(path, "a") as f:
        f.write(f"# appended line {number}\\n")
    time.sleep(0.001)
"""

APPENDED_LINES = 1000


@pytest.mark.slow
def test_lines_appended_while_rewrites_run_are_never_lost(tmp_path):
    path = write_entry(tmp_path, INPUT_PROVIDER)
    appender = subprocess.Popen([sys.executable, "-c", APPENDER, str(path), str(APPENDED_LINES)])
    outcomes = []
    try:
        # Longer and shorter literals alternately: the rest of the file moves each time.
        for batch_size in itertools.cycle([1024, 8]):
            if appender.poll() is not None:
                break
            try:
                set_batch_size(tmp_path, batch_size)
                outcomes.append("written")
            except SkylineError as exc:
                assert "changed" in exc.message and "nothing was written" in exc.message, exc.message
                outcomes.append("refused")
    finally:
        appender.wait()
    assert appender.returncode == 0
    assert outcomes  # rewrites ran while the lines were appended
    appended = [line for line in path.read_text().splitlines() if line.startswith("# appended line")]
    assert appended == [f"# appended line {number}" for number in range(APPENDED_LINES)]
    set_batch_size(tmp_path, 512)  # once the file is left alone, the rewrite goes through
    assert defaults(path) == ["512"]
    assert path.read_text().startswith(HEAD)


def test_a_file_that_changes_on_every_import_is_refused_and_keeps_every_change(tmp_path):
    """The entry point appends to itself when imported: the file changes between the read and the
    write each time, so the rewrite is retried, then refused; no appended line is lost."""
    path = write_entry(tmp_path, INPUT_PROVIDER + '\nwith open(__file__, "a") as f:\n    f.write("# imported\\n")\n')
    with pytest.raises(SkylineError) as caught:
        set_batch_size(tmp_path, 64)
    # Which check sees it first depends on how soon after the import the file is looked at.
    assert (caught.value.path, caught.value.hint) == (ENTRY, "Run the command again.")
    assert caught.value.message in (
        "the file changed while Skyline read it (another program wrote to it); nothing was written.",
        "the file changed moments ago, and may still be changing (another program wrote to it); nothing was written.",
    )
    text = path.read_text()
    assert defaults(path) == ["8"]
    assert text.count("# imported\n") == ATTEMPTS  # imported once per attempt
    assert text.endswith("# imported\n" * ATTEMPTS)


def test_a_file_modified_moments_ago_is_left_alone_after_every_attempt(tmp_path):
    """A file whose modification time is that of a moment ago (here: in the future, as a clock
    ahead on a network drive gives) is being written: it is imported once per attempt, never
    written, and the message says why."""
    imports = tmp_path / "imports"
    counted = f'\nwith open({str(imports)!r}, "a") as _f:\n    _f.write("import\\n")\n'
    path = write_entry(tmp_path, INPUT_PROVIDER + counted)
    ahead = path.stat().st_mtime + 3600
    os.utime(path, (ahead, ahead))
    before = path.read_bytes()
    with pytest.raises(SkylineError) as caught:
        set_batch_size(tmp_path, 64)
    assert (caught.value.path, caught.value.message, caught.value.hint) == (
        ENTRY,
        "the file changed moments ago, and may still be changing (another program wrote to it); nothing was written.",
        "Run the command again.",
    )
    assert path.read_bytes() == before
    assert imports.read_text() == "import\n" * ATTEMPTS


def test_a_file_above_a_mebibyte_is_rewritten_and_kept_whole(tmp_path):
    """The file is read in chunks of 1 MiB: what lies beyond the first one is compared and kept."""
    tail = "".join(f"# line {number:07d} of a long generated table\n" for number in range(60_000))  # 2.5 MiB
    path = write_entry(tmp_path, INPUT_PROVIDER + tail)
    assert path.stat().st_size > 2 << 20
    for batch_size in (1024, 1, 8):  # longer, shorter (the smallest there is), the same length
        set_batch_size(tmp_path, batch_size)
        assert defaults(path) == [str(batch_size)]
        assert path.read_text() == HEAD + INPUT_PROVIDER.replace("batch_size=8", f"batch_size={batch_size}", 1) + tail


def test_a_hard_linked_file_keeps_its_link_and_permissions(tmp_path):
    path = write_entry(tmp_path, INPUT_PROVIDER)
    link = tmp_path / "linked_elsewhere.py"
    os.link(path, link)
    path.chmod(0o640)
    before = path.stat()
    for batch_size in (1024, 8, 16):  # longer, shorter, the same length
        set_batch_size(tmp_path, batch_size)
        after = path.stat()
        assert (after.st_ino, after.st_nlink, after.st_mode, after.st_uid, after.st_gid) == (
            before.st_ino,
            2,
            before.st_mode,
            before.st_uid,
            before.st_gid,
        )
        assert link.read_bytes() == path.read_bytes()
        assert defaults(link) == [str(batch_size)]


def write_entry_that_appends_to_itself(root: Path, appended: bytes) -> Path:
    """An entry point that appends `appended` to its own file when imported and then sets the
    file's modification time back to an hour ago, where it already was: a change the quiet period
    cannot see."""
    path = write_entry(
        root,
        INPUT_PROVIDER
        + "\nimport os as _os\n"
        + "_old = _os.stat(__file__).st_mtime\n"
        + f'with open(__file__, "ab") as _f:\n    _f.write({appended!r})\n'
        + "_os.utime(__file__, (_old, _old))\n",
    )
    old = path.stat().st_mtime - 3600
    os.utime(path, (old, old))
    return path


def test_a_change_that_keeps_the_old_modification_time_is_still_seen(tmp_path):
    """Some tools write a file and set its modification time back (copies that keep times, a
    checkout): the quiet period cannot see that, the comparison of the file with what was
    imported must. The entry point rewrites itself so at import, then dates itself back."""
    path = write_entry_that_appends_to_itself(tmp_path, b"# imported\n")
    with pytest.raises(SkylineError) as caught:
        set_batch_size(tmp_path, 64)
    assert (caught.value.path, caught.value.message, caught.value.hint) == (
        ENTRY,
        "the file changed while Skyline read it (another program wrote to it); nothing was written.",
        "Run the command again.",
    )
    assert defaults(path) == ["8"]


# --- the file's own encoding ------------------------------------------------------------------

LATIN_1 = "# -*- coding: latin-1 -*-\n"
NON_ASCII = "# Modèle à l'échelle\n"


@pytest.mark.parametrize(
    ("head", "encoding"),
    [(b"\xef\xbb\xbf", "utf-8"), (b"", "latin-1")],
    ids=["bom", "latin-1-declared"],
)
def test_a_file_keeps_its_bom_or_declared_encoding(tmp_path, head, encoding):
    """The literal's place among the bytes is counted in the file's encoding, after its BOM: the
    non-ASCII text before the literal takes 2 bytes a character in UTF-8 and 1 in latin-1."""
    text = (LATIN_1 if encoding == "latin-1" else "") + HEAD + NON_ASCII + INPUT_PROVIDER
    path = tmp_path / ENTRY
    path.write_bytes(head + text.encode(encoding))
    for batch_size in (1024, 8):
        set_batch_size(tmp_path, batch_size)
        expected = text.replace("batch_size=8", f"batch_size={batch_size}")
        assert path.read_bytes() == head + expected.encode(encoding)


def test_a_file_that_stops_decoding_meanwhile_is_named(tmp_path):
    """The entry point writes a byte UTF-8 cannot decode into itself when imported, then dates
    itself back: the bytes read again before the write are refused as text, naming the file."""
    path = write_entry_that_appends_to_itself(tmp_path, b"# \xff\n")
    with pytest.raises(SkylineError) as caught:
        set_batch_size(tmp_path, 64)
    assert caught.value.path == ENTRY
    assert caught.value.message.startswith("the file is not UTF-8 text (byte 0xff cannot be decoded)")
    assert b"batch_size=8" in path.read_bytes()  # nothing written


# --- what the user is told when the write itself meets another program -----------------------


def test_an_entry_point_that_is_no_longer_a_file_is_named(tmp_path):
    """The entry point replaces itself by a folder when imported: the file cannot be opened for
    the write, and the message says why, naming it."""
    moves = "\nimport os as _os\n_os.remove(__file__)\n_os.mkdir(__file__)\n"
    write_entry(tmp_path, INPUT_PROVIDER + moves)
    with pytest.raises(SkylineError) as caught:
        set_batch_size(tmp_path, 64)
    assert (caught.value.path, caught.value.message) == (
        ENTRY,
        "cannot write the batch size into the file: Is a directory.",
    )


def test_bytes_changed_just_before_the_write_are_not_written_over(tmp_path):
    """`_write_in_place` reads the file once more right before writing: bytes another program
    wrote since the read are left alone, and the message says so."""
    path = tmp_path / "entry.py"
    path.write_bytes(b"batch_size=8\n# theirs\n")
    fd = os.open(path, os.O_RDWR)
    try:
        with pytest.raises(FileChanged) as caught:
            _write_in_place(fd, b"batch_size=8\n", b"batch_size=64\n", 11, 13, ENTRY)
    finally:
        os.close(fd)
    assert (caught.value.path, caught.value.message, caught.value.hint) == (
        ENTRY,
        "the file changed while Skyline rewrote its batch size (another program wrote to it); nothing was written.",
        "Run the command again.",
    )
    assert path.read_bytes() == b"batch_size=8\n# theirs\n"


def test_a_write_that_does_not_land_where_it_was_made_is_reported(tmp_path):
    """After the write the file is read back: when it does not start with what was written (here
    the file is open for appending, so the kernel puts the bytes at its end, as a program
    appending meanwhile could), the user is told to check the file."""
    path = tmp_path / "entry.py"
    path.write_bytes(b"batch_size=8\n")
    fd = os.open(path, os.O_RDWR | os.O_APPEND)
    try:
        with pytest.raises(SkylineError) as caught:
            _write_in_place(fd, b"batch_size=8\n", b"batch_size=64\n", 11, 13, ENTRY)
    finally:
        os.close(fd)
    assert (caught.value.path, caught.value.message) == (
        ENTRY,
        "another program wrote to the file while Skyline rewrote its batch size; check it.",
    )
