"""find_batch_size_location / rewrite_batch_size: spans are UTF-8 byte offsets, rewrites touch only the literal."""

from __future__ import annotations

from types import CodeType

import pytest

from skyline_engine.entry.batch_size import (
    BatchSizeLocation,
    find_batch_size_location,
    rewrite_batch_size,
)
from skyline_engine.entry.contract import INPUT_PROVIDER
from skyline_engine.entry.loader import read_source
from skyline_engine.errors import EntryPointError

PATH = "entry.py"


def provider_codes(source: str, name: str = INPUT_PROVIDER) -> list[CodeType]:
    """The code objects the compiler makes of `source`'s functions called `name`, in source order
    (compiled, not run: the sources below need not import)."""
    found = []
    pending = [compile(source, PATH, "exec")]
    while pending:
        code = pending.pop()
        found += [code] if code.co_name == name else []
        pending += [const for const in code.co_consts if isinstance(const, CodeType)]
    return sorted(found, key=lambda code: code.co_firstlineno)


def provider_code(source: str) -> CodeType:
    """The code of the one input provider of `source`."""
    (code,) = provider_codes(source)
    return code


def find(source: str, code: CodeType | None = None) -> BatchSizeLocation:
    location = find_batch_size_location(source, PATH, code or provider_code(source))
    assert location is not None
    return location


def rewrite(source: str, new_batch_size, path: str = PATH) -> str:
    return rewrite_batch_size(source, new_batch_size, path, provider_code(source))


def literal_bytes(source: str, location: BatchSizeLocation) -> bytes:
    """The bytes the location spans, splitting lines as ast does."""
    line = source.replace("\r\n", "\n").replace("\r", "\n").split("\n")[location.line - 1]
    return line.encode("utf-8")[location.col_start : location.col_end]


# --- finding -------------------------------------------------------------------------------


def test_positional_default():
    source = "import torch\n\ndef skyline_input_provider(batch_size=32):\n    return (torch.zeros(batch_size),)\n"
    location = find(source)
    assert (location.line, location.col_start, location.col_end) == (3, 38, 40)
    assert location.editable and location.value == 32 and location.reason is None
    assert literal_bytes(source, location) == b"32"
    assert location.to_dict() == {
        "path": PATH,
        "line": 3,
        "col_start": 38,
        "col_end": 40,
        "editable": True,
        "value": 32,
        "reason": None,
    }


def test_a_lambda_providers_default():
    # `skyline_input_provider = lambda batch_size=16: ...` was told it had no `batch_size` default.
    source = "import torch\n\nskyline_input_provider = lambda batch_size=16: (torch.zeros(batch_size),)\n"
    (code,) = provider_codes(source, "<lambda>")
    location = find(source, code)
    assert (location.line, location.value, location.editable) == (3, 16, True)
    assert literal_bytes(source, location) == b"16"
    assert rewrite_batch_size(source, 64, PATH, code) == source.replace("batch_size=16", "batch_size=64")


def test_keyword_only_default():
    source = "def skyline_input_provider(*, seed=0, batch_size=64, device='cuda'):\n    pass\n"
    location = find(source)
    assert location.value == 64 and location.editable
    assert literal_bytes(source, location) == b"64"


def test_defaults_align_to_the_end_of_the_parameters():
    source = "def skyline_input_provider(a, batch_size=16, other=3):\n    pass\n"
    location = find(source)
    assert location.value == 16
    assert literal_bytes(source, location) == b"16"


def test_positional_only_parameters_count_for_alignment():
    source = "def skyline_input_provider(a=1, /, b=2, batch_size=8, c=4):\n    pass\n"
    assert find(source).value == 8


def test_decorated_function():
    source = (
        "import functools\n\n@functools.lru_cache()\n@other\ndef skyline_input_provider(batch_size=12):\n    pass\n"
    )
    location = find(source)
    assert (location.line, location.value) == (5, 12)


def test_each_definition_is_found_by_its_code():
    """Which `def` ran is the loaded module's business (tests/test_rewrite_safety.py): each one's
    code leads to its own default, not to the last in the file."""
    source = (
        "def skyline_input_provider(batch_size=8):\n    pass\n\ndef skyline_input_provider(batch_size=48):\n    pass\n"
    )
    first, last = provider_codes(source)
    assert (find(source, first).line, find(source, first).value) == (1, 8)
    assert (find(source, last).line, find(source, last).value) == (4, 48)


def test_definition_inside_module_level_if_counts():
    source = "if True:\n    def skyline_input_provider(batch_size=24):\n        pass\n"
    assert find(source).value == 24


def test_nested_functions_and_methods_are_found_by_their_code_too():
    source = (
        "def skyline_input_provider(batch_size=32):\n"
        "    def skyline_input_provider(batch_size=99):\n        pass\n\n"
        "class Provider:\n"
        "    def skyline_input_provider(self, batch_size=77):\n        pass\n"
    )
    assert [find(source, code).value for code in provider_codes(source)] == [32, 99, 77]


def test_a_function_of_another_name_is_found_by_its_code():
    # `skyline_input_provider = make_inputs`: the module holds make_inputs' code.
    source = "def make_inputs(batch_size=12):\n    pass\n\nskyline_input_provider = make_inputs\n"
    (code,) = provider_codes(source, "make_inputs")
    assert (find(source, code).line, find(source, code).value) == (1, 12)


def test_code_of_another_text_gives_none():
    # The file changed since the code was compiled: its `def` is no longer at that line.
    code = provider_code("\n\ndef skyline_input_provider(batch_size=32):\n    pass\n")
    assert find_batch_size_location("def skyline_input_provider(batch_size=32):\n    pass\n", PATH, code) is None


def test_missing_parameter_gives_none():
    source = "def skyline_input_provider(size=32):\n    pass\n"
    assert find_batch_size_location(source, PATH, provider_code(source)) is None


@pytest.mark.parametrize(
    "signature",
    ["(batch_size)", "(batch_size, other=3)", "(*, batch_size)", "(*, batch_size, other=3)"],
)
def test_missing_default_gives_none(signature):
    source = f"def skyline_input_provider{signature}:\n    pass\n"
    assert find_batch_size_location(source, PATH, provider_code(source)) is None


def test_syntax_error_is_raised():
    code = provider_code("def skyline_input_provider(batch_size=32):\n    pass\n")
    with pytest.raises(SyntaxError) as caught:
        find_batch_size_location("def skyline_input_provider(batch_size=32:\n", PATH, code)
    assert (caught.value.filename, caught.value.lineno) == (PATH, 1)  # the error names the file


@pytest.mark.parametrize(
    "default, value, reason",
    [
        ("BATCH * 2", None, "the default is the expression `BATCH * 2`, not an integer literal"),
        (
            "BATCH",
            None,
            "the default is `BATCH`, which is not one integer literal assigned once at the top level of entry.py",
        ),
        ("True", None, "the default is `True`, a boolean, not an integer literal"),
        ("32.0", None, "the default is `32.0`, a float, not an integer literal"),
        ("'32'", None, "the default is `'32'`, a string, not an integer literal"),
        ("2j", None, "the default is `2j`, a complex number, not an integer literal"),
        ("None", None, "the default is `None`, not an integer literal"),
        ("b'32'", None, "the default is `b'32'`, bytes, not an integer literal"),
        ("-5", None, "the default is `-5`, but the batch size must be greater than 0"),
        ("0", 0, "the default is `0`, but the batch size must be greater than 0"),
    ],
)
def test_non_editable_defaults(default, value, reason):
    source = f"def skyline_input_provider(batch_size={default}):\n    pass\n"
    location = find(source)
    assert not location.editable
    assert location.value == value
    assert location.reason == reason
    assert literal_bytes(source, location) == default.encode()


@pytest.mark.parametrize(
    "top, line, span, value",
    [
        ("BATCH_SIZE = 64  # per device\n", 1, (13, 15), 64),
        ("BATCH_SIZE: int = 0x40\n", 1, (18, 22), 64),
        ("BATCH = 8\nBATCH_SIZE = 64\n", 2, (13, 15), 64),
    ],
)
def test_a_constant_the_default_names_is_the_literal(top, line, span, value):
    # BATCH_SIZE = 64 at the top, then batch_size=BATCH_SIZE: the keys and --set-batch-size
    # edit the constant, which only the default reads (the editor's literal.lua finds the same).
    source = f"{top}\ndef skyline_input_provider(batch_size=BATCH_SIZE):\n    pass\n"
    location = find(source)
    assert (location.line, location.col_start, location.col_end) == (line, *span)
    assert location.editable and location.value == value
    assert rewrite(source, 128) == source.replace(source.splitlines()[line - 1], _with_128(top, line), 1)


def _with_128(top: str, line: int) -> str:
    text = top.splitlines()[line - 1]
    return text.replace("0x40", "128").replace("64", "128")


@pytest.mark.parametrize(
    "top, reason",
    [
        ("BATCH = 32\nLR = 0.1 * BATCH\n", "which line 2 uses too: changing it would change more than the batch size"),
        ("BATCH = 32\nBATCH = 64\n", "which is not one integer literal assigned once at the top level of entry.py"),
        ("from config import BATCH\n", "which is not one integer literal assigned once at the top level of entry.py"),
        ("if True:\n    BATCH = 32\n", "which is not one integer literal assigned once at the top level of entry.py"),
        ("BATCH = 2 ** 5\n", "which is the expression `2 ** 5`, not an integer literal"),
        ("BATCH = 0\n", "which is `0`, but the batch size must be greater than 0"),
    ],
)
def test_a_constant_used_elsewhere_or_not_one_literal_is_not_editable(top, reason):
    source = f"{top}\ndef skyline_input_provider(batch_size=BATCH):\n    pass\n"
    location = find(source)
    assert not location.editable and location.reason == f"the default is `BATCH`, {reason}"
    with pytest.raises(EntryPointError, match="Cannot rewrite the batch size"):
        rewrite(source, 128)


def test_multi_line_default_is_not_editable():
    source = "def skyline_input_provider(batch_size=(BATCH *\n                                      2)):\n    pass\n"
    location = find(source)
    assert not location.editable and location.value is None
    assert "spans lines 1-2" in location.reason
    assert location.line == 1
    assert literal_bytes(source, location) == b"BATCH *"  # the node, without its parenthesis


@pytest.mark.parametrize("literal, value", [("1_024", 1024), ("0x20", 32), ("0o10", 8), ("0b100", 4)])
def test_int_literal_spellings(literal, value):
    source = f"def skyline_input_provider(batch_size={literal}):\n    pass\n"
    location = find(source)
    assert location.editable and location.value == value
    assert literal_bytes(source, location) == literal.encode()


def test_parenthesized_literal_spans_the_digits():
    source = "def skyline_input_provider(batch_size=( 32 )):\n    pass\n"
    assert literal_bytes(source, find(source)) == b"32"


def test_non_ascii_before_the_literal_gives_byte_offsets():
    source = "def skyline_input_provider(name='héllo wörld ✓', batch_size=32):  # ünïcode\n    pass\n"
    location = find(source)
    line_bytes = source.splitlines()[0].encode("utf-8")
    assert line_bytes[location.col_start : location.col_end] == b"32"
    assert location.col_start != source.splitlines()[0].index("32")  # characters would be wrong


def test_line_numbers_follow_ast_not_str_splitlines():
    # Form feed and U+2028 in a comment are no line breaks for Python, but are for str.splitlines.
    source = "# a\x0cb \u2028 c\r\nx = 1\rdef skyline_input_provider(é=1, batch_size=32):\n    pass\n"
    location = find(source)
    assert location.line == 3
    assert literal_bytes(source, location) == b"32"


# --- rewriting -----------------------------------------------------------------------------


def test_rewrite_preserves_every_other_byte():
    source = (
        "# entry point\r\n"
        'HELP = "call it as skyline_input_provider(batch_size=32)"\r\n'
        "def helper(batch_size=32):\r\n"
        "    return batch_size\r\n"
        "def skyline_input_provider(batch_size=32):   # the batch size, batch_size=32\r\n"
        "    return (helper(batch_size),)  \r\n"
        "\r\n"
        "# end without newline   "
    )
    rewritten = rewrite(source, 64)
    expected = source.replace(
        "def skyline_input_provider(batch_size=32):", "def skyline_input_provider(batch_size=64):"
    )
    assert rewritten == expected
    assert rewritten.count("batch_size=32") == source.count("batch_size=32") - 1


@pytest.mark.parametrize("old, new", [(8, 1024), (1024, 8), (32, 32)])
def test_rewrite_grows_and_shrinks_digits(old, new):
    source = f"def skyline_input_provider(x=1, batch_size={old}, y=2):\n    pass"
    assert rewrite(source, new) == f"def skyline_input_provider(x=1, batch_size={new}, y=2):\n    pass"


def test_rewrite_with_non_ascii_before_the_literal():
    source = "def skyline_input_provider(name='ä✓', batch_size=32):\r\n    pass\r\n"
    assert rewrite(source, 256) == source.replace("=32", "=256")


def test_rewrite_underscore_literal():
    source = "def skyline_input_provider(batch_size=1_024):\n    pass\n"
    assert rewrite(source, 16) == "def skyline_input_provider(batch_size=16):\n    pass\n"


def test_round_trip():
    source = "import torch\r\ndef skyline_input_provider(é='ü', *, batch_size=8):  # keep\r\n    pass"
    rewritten = rewrite(source, 1024)
    before, after = find(source), find(rewritten)
    assert after.value == 1024 and after.editable
    assert (after.line, after.col_start) == (before.line, before.col_start)
    assert after.col_end == after.col_start + len("1024")
    assert literal_bytes(rewritten, after) == b"1024"


@pytest.mark.parametrize("bad", [0, -1, True, False, 2.0, "64", None])
def test_rewrite_rejects_bad_batch_sizes(bad):
    with pytest.raises(ValueError, match="greater than 0"):
        rewrite("def skyline_input_provider(batch_size=32):\n    pass\n", bad)


def test_rewrite_rejects_non_editable_default_and_names_the_line():
    source = "BATCH = 16\n\ndef skyline_input_provider(batch_size=BATCH * 2):\n    pass\n"
    with pytest.raises(EntryPointError) as caught:
        rewrite(source, 64)
    error = caught.value
    assert (error.path, error.line) == (PATH, 3)
    assert "`BATCH * 2`" in error.message
    assert error.hint == HINT
    assert str(error).startswith("entry.py:3: ")


def test_rewrite_rejects_missing_location():
    with pytest.raises(EntryPointError) as caught:
        rewrite("def skyline_input_provider(batch_size):\n    pass\n", 64)
    assert (caught.value.path, caught.value.line) == (PATH, None)
    assert caught.value.message == "Found no `skyline_input_provider` with a `batch_size` default to rewrite."
    assert caught.value.hint == HINT


# What both refusals tell the user to write (docs/entry-points.md: the rewritten default is an integer literal).
HINT = "Write the default as an integer literal, e.g. `def skyline_input_provider(batch_size=32):`."


def test_a_literal_on_the_last_line_without_a_line_break():
    source = "import torch\ndef skyline_input_provider(batch_size=8): return (torch.ones(batch_size),)"
    assert rewrite(source, 64) == source.replace("batch_size=8", "batch_size=64")


def test_the_smallest_batch_size_is_written():
    assert rewrite("def skyline_input_provider(batch_size=32):\n    pass\n", 1) == (
        "def skyline_input_provider(batch_size=1):\n    pass\n"
    )


# --- the columns as the editor counts them ---------------------------------------------------

BOM = b"\xef\xbb\xbf"


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(BOM + b"def skyline_input_provider(batch_size=32):\n    pass\n", id="bom"),
        pytest.param(
            "# -*- coding: latin-1 -*-\ndef skyline_input_provider(label='é', batch_size=32):\n    pass\n".encode(
                "latin-1"
            ),
            id="latin-1-declared",
        ),
    ],
)
def test_columns_are_those_of_the_text_neovim_holds(nvim, tmp_path, data):
    """Read as Python reads it, the file's text is the buffer's: Neovim keeps a BOM out of the
    buffer ('bomb') and holds a Latin-1 file as UTF-8, so the byte columns point at the literal
    in the buffer, on the first line too."""
    path = tmp_path / PATH
    path.write_bytes(data)
    source = read_source(path, PATH)
    location = find(source)
    nvim.command(f"edit {path}")
    line = nvim.current.buffer[location.line - 1].encode("utf-8")
    assert line[location.col_start : location.col_end] == b"32"
    assert nvim.eval("&bomb") == (1 if data.startswith(BOM) else 0)
