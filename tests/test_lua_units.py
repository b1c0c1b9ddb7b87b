"""The plugin's pure Lua modules, unit by unit, in a real headless Neovim: number formatting, the
batch_size literal locator, the models' formula, option validation, the file-to-buffer line
mapping and a section of the float. Every expected value is written here, worked out by hand,
never computed by the code under test."""

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

# Calls require(module)[name] with each argument list of `cases` inside Neovim; each result comes
# back as [first, second] (nil as None: a Lua list with a hole would not survive the trip).
EACH = """
local module, name, cases = ...
local fn = require(module)[name]
local out = {}
for i, case in ipairs(cases) do
  local first, second = fn(unpack(case))
  out[i] = { first == nil and vim.NIL or first, second == nil and vim.NIL or second }
end
return out
"""


def call_each(nvim, module: str, name: str, cases: list) -> list:
    return nvim.exec_lua(EACH, module, name, cases)


# --- format.lua -----------------------------------------------------------------------------


def test_format_bytes_integers_throughput_and_bars(nvim):
    cases = [
        (0, "0 B"),
        (1, "1 B"),
        (512.4, "512 B"),
        (512.6, "513 B"),  # rounded like the engine, not truncated
        (0.75, "1 B"),
        (2.5, "2 B"),  # a tie goes to the even neighbour, as in Python
        (3.5, "4 B"),
        (1023, "1023 B"),
        (1024, "1.0 KiB"),
        (1536, "1.5 KiB"),
        (1280, "1.2 KiB"),  # 1.25: a tie
        (1792, "1.8 KiB"),  # 1.75: a tie
        (873811, "853.3 KiB"),
        (1024**2 - 1, "1024.0 KiB"),
        (1024**2, "1.0 MiB"),
        (1024**3, "1.0 GiB"),
        (1024**4, "1.0 TiB"),
        (1024**5, "1024.0 TiB"),  # no unit above TiB
        (-1024, "-1.0 KiB"),
    ]
    shown = call_each(nvim, "skyline.format", "bytes", [[value] for value, _ in cases])
    assert [result[0] for result in shown] == [text for _, text in cases]
    assert nvim.exec_lua("return require('skyline.format').bytes(nil)") == "—"

    integers = call_each(nvim, "skyline.format", "integer", [[0], [999], [1000], [1234567.4], [-1234], [999.5]])
    assert [result[0] for result in integers] == ["0", "999", "1,000", "1,234,567", "-1,234", "1,000"]
    assert nvim.exec_lua("return require('skyline.format').throughput(64000.2)") == "64,000 samples/s"
    assert nvim.exec_lua("return require('skyline.format').throughput(nil)") == "— samples/s"
    assert nvim.exec_lua("return require('skyline.format').ms(2)") == "2.00 ms"
    assert nvim.exec_lua("return require('skyline.format').percent(0.1234)") == "12.3%"
    bars = call_each(nvim, "skyline.format", "bar", [[0.5, 4], [-1, 3], [2, 3], [0.2, 10]])
    assert [result[0] for result in bars] == ["██░░", "░░░", "███", "██░░░░░░░░"]


# --- literal.lua ----------------------------------------------------------------------------


def test_python_integer_literals(nvim):
    cases = {
        "128": 128,
        "0": 0,
        "00": 0,
        "1_024": 1024,
        "0x80": 128,
        "0X_80": 128,
        "0o200": 128,
        "0b10000000": 128,
        "0128": None,  # a syntax error in Python 3
        "1__0": None,
        "1_": None,
        "_1": None,
        "0x": None,
        "0b2": None,
        "1.5": None,
        "1e3": None,
        "128j": None,
        "": None,
        "abc": None,
    }
    results = call_each(nvim, "skyline.literal", "integer", [[text] for text in cases])
    assert dict(zip(cases, (first for first, _ in results))) == cases


def test_the_literal_on_one_line(nvim):
    cases = [
        # text, expected {col_start, col_end, value} or None, expected reason (a fragment) or None
        ("def skyline_input_provider(batch_size=128):", {"col_start": 38, "col_end": 41, "value": 128}, None),
        ("    batch_size: int = 64,  # the default", {"col_start": 22, "col_end": 24, "value": 64}, None),
        ("def skyline_input_provider(*, batch_size = 0x20):", {"col_start": 43, "col_end": 47, "value": 32}, None),
        ("    batch_size=8", {"col_start": 15, "col_end": 16, "value": 8}, None),
        ("def f(model_batch_size=4):", None, None),  # another name: no default of batch_size
        ("def f(batch_size):", None, None),
        ("def skyline_input_provider(batch_size=2 ** 7):", None, "`2 ** 7` is not an integer literal"),
        ("def skyline_input_provider(batch_size=-4):", None, "`-4` is not an integer literal"),
        ("def skyline_input_provider(batch_size=0):", None, "`0` must be greater than 0"),
        ("def skyline_input_provider(batch_size=1.5):", None, "`1.5` is not an integer literal"),
        ("def skyline_input_provider(batch_size=(128)):", None, "is not an integer literal"),
    ]
    results = call_each(nvim, "skyline.literal", "on_line", [[text] for text, _, _ in cases])
    for (text, expected, reason), (found, why) in zip(cases, results):
        assert found == expected, text
        if reason is None:
            assert why is None, text
        else:
            assert reason in why and "\n" not in why, (text, why)


def test_the_literal_in_a_file(nvim):
    multi_line = [
        "import torch",
        "",
        "def skyline_input_provider(",
        "    seed: int = 0,",
        "    batch_size: int = 256,  # per step",
        ") -> tuple:",
        "    return (torch.randn(batch_size, 4),)",
    ]
    # Non-ASCII before the literal: columns count bytes (é is two), as nvim_buf_set_text does.
    non_ascii = ['def skyline_input_provider(légende="é", batch_size=32):']
    later_wins = [
        "def skyline_input_provider(batch_size=16):",
        "    pass",
        "def skyline_input_provider(batch_size=48):",
    ]
    no_provider = ["def other(batch_size=16):", "    pass"]
    outside_signature = ["def skyline_input_provider(n=1):", "    batch_size = 12"]
    results = call_each(
        nvim, "skyline.literal", "find", [[multi_line], [non_ascii], [later_wins], [no_provider], [outside_signature]]
    )
    assert results[0] == [{"row": 4, "col_start": 22, "col_end": 25, "value": 256}, None]
    assert results[1] == [{"row": 0, "col_start": 53, "col_end": 55, "value": 32}, None]
    assert results[2] == [{"row": 2, "col_start": 38, "col_end": 40, "value": 48}, None]
    assert results[3] == [None, None]
    assert results[4] == [None, None]


def test_the_constant_the_default_names(nvim):
    # As the engine finds them (tests/test_batch_size_location.py): a constant at the top of the
    # file that only the default reads is the literal; anything else keeps the keys off.
    provider = "def skyline_input_provider(batch_size=BATCH):"
    commented = ["BATCH_SIZE = 64  # per device", "", "def skyline_input_provider(batch_size=BATCH_SIZE):"]
    annotated = ["BATCH: int = 0x20", "def skyline_input_provider(*, batch_size=BATCH):"]
    longer_name_first = ["BATCH_SIZE = 8", "BATCH = 32", provider]
    used = ["BATCH = 32", "LR = 0.1 * BATCH", provider]
    twice = ["BATCH = 32", "BATCH = 64", provider]
    imported = ["from config import BATCH", provider]
    keyword = ["def skyline_input_provider(batch_size=None):"]
    cases = [commented, annotated, longer_name_first, used, twice, imported, keyword]
    results = call_each(nvim, "skyline.literal", "find", [[lines] for lines in cases])
    assert results[0] == [{"row": 0, "col_start": 13, "col_end": 15, "value": 64}, None]
    assert results[1] == [{"row": 0, "col_start": 13, "col_end": 17, "value": 32}, None]
    assert results[2] == [{"row": 1, "col_start": 8, "col_end": 10, "value": 32}, None]
    also = "the batch_size default `BATCH` is also on line {}: write a number, or a constant only the default uses"
    assert results[3][0] is None and results[3][1].startswith(also.format(2))
    assert results[4][0] is None and results[4][1].startswith(also.format(2))
    assert results[5][0] is None and results[5][1].startswith(also.format(1))
    assert results[6] == [
        None,
        "the batch_size default `None` is not an integer literal; write a number to use the batch-size keys",
    ]


def test_the_literal_of_the_definition_that_ran(nvim):
    # `if`/`else`: the engine found the first definition to have run (its location's row, 2,
    # where the buffer holds it now); the text alone would say the last one.
    branches = [
        "import os",
        "if os.name == 'posix':",
        "    def skyline_input_provider(batch_size=64):",
        "        pass",
        "else:",
        "    def skyline_input_provider(batch_size=8):",
        "        pass",
    ]
    results = call_each(nvim, "skyline.literal", "find", [[branches, 2], [branches, 5], [branches]])
    assert results[0] == [{"row": 2, "col_start": 42, "col_end": 44, "value": 64}, None]
    assert results[1] == [{"row": 5, "col_start": 42, "col_end": 43, "value": 8}, None]
    assert results[2] == results[1]  # where the analysis located it is unknown: the last one


# --- models.lua -----------------------------------------------------------------------------

MODELS = {
    "run_time_ms": {"slope": 2.0, "bias": 4.0},
    "peak_memory_bytes": {"slope": 1000.0, "bias": 5000.0},
    "usable_memory_bytes": 13000,
    "trusted_range": [8, 128],
}
NEGATIVE_BIAS = {
    "run_time_ms": {"slope": 1.0, "bias": -10.0},
    "peak_memory_bytes": {"slope": 10.0, "bias": -100.0},
    "usable_memory_bytes": 0,
    "trusted_range": [1, 100],
}
# The peak is the highest of the phases' lines: the optimizer's (flat, 9000 bytes) up to 4
# samples, the forward and backward passes' (2000 a sample, 1000 more) above.
PHASES = {
    "run_time_ms": {"slope": 0.0, "bias": 3.0},
    "peak_memory_bytes": {
        "slope": 2000.0,
        "bias": 1000.0,
        "phases": [
            {"name": "optimizer", "slope": 0.0, "bias": 9000.0},
            {"name": "forward_backward", "slope": 2000.0, "bias": 1000.0},
        ],
    },
    "usable_memory_bytes": 11000,
    "trusted_range": [2, 16],
}


def test_the_models_formula(nvim):
    cases = [[MODELS, 8], [MODELS, 9], [MODELS, 200], [NEGATIVE_BIAS, 5], [NEGATIVE_BIAS, 10], [NEGATIVE_BIAS, 20]]
    cases += [[PHASES, 1], [PHASES, 4], [PHASES, 5], [PHASES, 6]]
    results = [result[0] for result in call_each(nvim, "skyline.models", "predict", cases)]
    assert results == [
        # 2*8+4 = 20 ms: 8/20*1000 = 400 samples/s; 1000*8+5000 = 13000 bytes, just fits
        {"batch_size": 8, "run_time_ms": 20, "samples_per_second": 400, "peak_memory_bytes": 13000, "fits": True,
         "extrapolated": False},
        {"batch_size": 9, "run_time_ms": 22, "samples_per_second": 9 / 22 * 1000, "peak_memory_bytes": 14000,
         "fits": False, "extrapolated": False},
        {"batch_size": 200, "run_time_ms": 404, "samples_per_second": 200 / 404 * 1000, "peak_memory_bytes": 205000,
         "fits": False, "extrapolated": True},
        # a run time that is not positive has no time and no throughput (nil), never a negative one
        {"batch_size": 5, "peak_memory_bytes": -50, "fits": True, "extrapolated": False},
        {"batch_size": 10, "peak_memory_bytes": 0, "fits": True, "extrapolated": False},
        {"batch_size": 20, "run_time_ms": 10, "samples_per_second": 2000, "peak_memory_bytes": 100, "fits": False,
         "extrapolated": False},
        # a time that does not grow with the batch size predicts no time at all
        {"batch_size": 1, "peak_memory_bytes": 9000, "fits": True, "extrapolated": True},
        {"batch_size": 4, "peak_memory_bytes": 9000, "fits": True, "extrapolated": False},
        {"batch_size": 5, "peak_memory_bytes": 11000, "fits": True, "extrapolated": False},
        {"batch_size": 6, "peak_memory_bytes": 13000, "fits": False, "extrapolated": False},
    ]  # fmt: skip
    assert nvim.exec_lua("return require('skyline.models').predict(nil, 8)") is None


# --- virtual_text.lua -----------------------------------------------------------------------


def record(forward: float, backward: float, step: float = 0.0, memory: int = 0) -> dict:
    return {"forward_ms": forward, "backward_ms": backward, "step_ms": step, "memory_bytes": memory}


def test_a_line_shows_the_phases_that_did_work(nvim):
    totals = {"run_time_ms": 10.0, "peak_memory_bytes": 1 << 20}
    cases = [
        [record(0.4, 0.81, memory=1 << 20), totals, "self"],
        [record(1.31, 0.0), totals, "self"],  # an evaluation under no_grad: no backward at all
        [record(0.0, 0.5), totals, "self"],
        [record(0.0, 0.0, step=0.25), totals, "self"],
        [record(0.004, 0.0), totals, "self"],  # ran, if briefly: shown as it rounds
        [record(0.0, 0.0), totals, "self"],
    ]
    texts = [result[0] for result in call_each(nvim, "skyline.virtual_text", "annotation", cases)]
    assert texts == [
        "fwd 0.40 + bwd 0.81 ms · 12.1% · 1.0 MiB",
        "fwd 1.31 ms · 13.1%",
        "bwd 0.50 ms · 5.0%",
        "step 0.25 ms · 2.5%",
        "fwd 0.00 ms · 0.0%",
        None,
    ]


# --- float/ (wrap: layout.lua, public as skyline.float.wrap) --------------------------------


def test_wrapped_text_keeps_a_number_with_its_unit(nvim):
    cases = [
        ["abc 8.8 MiB", 7, ""],  # `abc 8.8` fits in 7, but `MiB` stays with its number
        ["peak (2.0 KiB) here", 9, ""],  # inside parentheses too
        ["took 1,024 ms;", 10, ""],
        ["8.8 apples pie", 10, ""],  # no unit: the words wrap apart as they come
        ["a b c", 3, "  "],  # the indent starts each line after the first
    ]
    lines = [result[0] for result in call_each(nvim, "skyline.float", "wrap", cases)]
    assert lines == [
        ["abc", "8.8 MiB"],
        ["peak", "(2.0 KiB)", "here"],
        ["took", "1,024 ms;"],
        ["8.8 apples", "pie"],
        ["a b", "  c"],
    ]


def test_a_float_section_draws_from_the_context_it_is_given(nvim):
    # In an editor that has profiled nothing: the section reads its context, never the state.
    lines = nvim.exec_lua("""
        local sheet = require('skyline.float.layout').new(30)
        local document = { compilation = { graphs = 2, seconds = 1.5 }, attribution = { mode = 'eager_replay' } }
        require('skyline.float.compilation').render(sheet, { document = document, width = 30 })
        return sheet.lines
    """)
    beneath = " " * 14  # the label's width: 16 cells of text a line in 30
    assert lines == [
        "Compiled      torch.compile: 2",
        beneath + "graph(s) in",
        beneath + "1.5 s, not in",  # a number keeps its unit
        beneath + "the iteration's",
        beneath + "time",
        beneath + "per-line times",
        beneath + "from an eager",
        beneath + "run of the",
        beneath + "iteration",
    ]
    sections = [path for path in (REPO / "lua" / "skyline" / "float").glob("*.lua") if path.name != "init.lua"]
    assert sections and not [path.name for path in sections if "skyline.state" in path.read_text()]


# --- config.lua -----------------------------------------------------------------------------


def test_the_defaults_come_from_the_schema(nvim):
    assert nvim.exec_lua("return require('skyline.config').defaults") == {
        "engine_args": [],
        "root_markers": [".git", "pyproject.toml", "setup.py", "setup.cfg"],
        "world_size": 1,
        "virt_text_pos": "eol_right_align",
        "costs": "both",
        "priorities": {"virt_text": 4096, "signs": 10},
        "cost_thresholds": {"mid": 0.05, "high": 0.20},
        "batch_step": "double",
        "reprofile_delay_ms": 800,
        "keymaps": {"batch_inc": "<localleader>+", "batch_dec": "<localleader>-"},
        "profile_on_save": True,
        "save_debounce_ms": 300,
    }
    names = nvim.exec_lua("return vim.tbl_map(function(o) return o.name end, require('skyline.config').schema)")
    assert names == [
        "python",
        "engine_args",
        "device",
        "project_root",
        "root_markers",
        "entry_point",
        "time_limit_s",
        "memory_capacity",
        "world_size",
        "virt_text_pos",
        "costs",
        "priorities",
        "cost_thresholds",
        "float_border",
        "batch_step",
        "reprofile_delay_ms",
        "keymaps",
        "profile_on_save",
        "save_debounce_ms",
    ]
    assert nvim.exec_lua(
        "return vim.iter(require('skyline.config').schema):all(function(o)"
        " return type(o.description) == 'string' and o.description ~= '' and not o.description:find('\\n') end)"
    )


APPLY = "local ok, result = require('skyline.config').apply(...); return {ok, result}"


@pytest.mark.parametrize(
    "options, message",
    [
        ({"python": 3}, "python: expected string, got number"),
        ({"engine_args": "--quick"}, "engine_args: expected a list of strings, got --quick"),
        ({"root_markers": [".git", 1]}, "root_markers: expected a list of strings"),
        ({"time_limit_s": 0}, "time_limit_s: expected a positive number"),
        ({"virt_text_pos": "inline"}, "virt_text_pos: expected one of eol, eol_right_align, right_align"),
        ({"cost_thresholds": 0.5}, "cost_thresholds: expected table, got number"),
        ({"cost_thresholds": {"high": 2}}, "cost_thresholds.high: expected a number from 0 to 1"),
        ({"cost_thresholds": {"mid": 0.5, "high": 0.4}}, "cost_thresholds: expected mid <= high"),
        ({"float_border": 1}, "float_border: expected string|table, got number"),
        ({"batch_step": 0}, "batch_step: expected 'double' or an integer >= 1"),
        ({"batch_step": 1.5}, "batch_step: expected 'double' or an integer >= 1"),
        ({"reprofile_delay_ms": -1}, "reprofile_delay_ms: expected an integer >= 0"),
        ({"keymaps": True}, "keymaps: expected a table or false"),
        ({"keymaps": {"batch_inc": 3}}, "keymaps.batch_inc: expected string, got number"),
        ({"profile_on_save": "yes"}, "profile_on_save: expected boolean, got string"),
        ({"save_debounce_ms": 0.5}, "save_debounce_ms: expected an integer >= 0"),
    ],
)
def test_a_bad_option_is_named_and_changes_nothing(nvim, options, message):
    before = nvim.exec_lua("return require('skyline.config').get()")
    ok, result = nvim.exec_lua(APPLY, options)
    assert ok is False
    assert result.startswith(message), result
    assert "\n" not in result
    assert nvim.exec_lua("return require('skyline.config').get()") == before


def test_good_options_merge_over_the_defaults(nvim):
    ok, unknown = nvim.exec_lua(
        APPLY,
        {
            "device": "cpu",
            "root_markers": ["setup.py"],  # a list replaces the default whole
            "cost_thresholds": {"high": 0.5},  # a table is merged key by key
            "keymaps": {"batch_dec": ""},
            "batch_step": 4,
            "float_border": ["+", "-", "+", "|", "+", "-", "+", "|"],
            "colour": 1,
            "keymaps_extra": True,
        },
    )
    assert ok is True
    assert sorted(unknown) == ["colour", "keymaps_extra"]
    current = nvim.exec_lua("return require('skyline.config').get()")
    assert current["device"] == "cpu"
    assert current["root_markers"] == ["setup.py"]
    assert current["cost_thresholds"] == {"mid": 0.05, "high": 0.5}
    assert current["keymaps"] == {"batch_inc": "<localleader>+", "batch_dec": ""}
    assert current["batch_step"] == 4
    assert "colour" not in current
    ok, unknown = nvim.exec_lua(APPLY, {"keymaps": False, "cost_thresholds": {"low": 0.1}})
    assert ok is True and unknown == ["cost_thresholds.low"]
    assert nvim.exec_lua("return require('skyline.config').get().keymaps") is False
    # Each apply starts from the defaults: options of an earlier setup() do not linger.
    assert nvim.exec_lua("return require('skyline.config').get().device") is None
    assert nvim.exec_lua("return {require('skyline.config').apply()}") == [True, []]


# --- anchors.lua ----------------------------------------------------------------------------

FILE = ["import torch", "", "def f(x):", "    return x", "", "def skyline_input_provider(batch_size=128):", "    pass"]


@pytest.mark.parametrize(
    "buffer, expected, differs",
    [
        (FILE, {1: 1, 2: 2, 3: 3, 4: 4, 5: 5, 6: 6, 7: 7}, False),
        # Only the batch_size literal differs: the same text, for what the request sends.
        ([*FILE[:5], "def skyline_input_provider(batch_size=4096):", "    pass"], {i: i for i in range(1, 8)}, False),
        # Two lines added at the top: every line moves down by two.
        (["# a", "# b", *FILE], {i: i + 2 for i in range(1, 8)}, True),
        # Line 2 deleted: lines below move up; the deleted one has no row.
        ([FILE[0], *FILE[2:]], {1: 1, 3: 2, 4: 3, 5: 4, 6: 5, 7: 6}, True),
        # Line 4 changed in place: it is still that line.
        ([*FILE[:3], "    return x * 2", *FILE[4:]], {i: i for i in range(1, 8)}, True),
        # Line 4 replaced by two lines: neither is it; the lines below move down by one.
        ([*FILE[:3], "    y = x", "    return y", *FILE[4:]], {1: 1, 2: 2, 3: 3, 5: 6, 6: 7, 7: 8}, True),
    ],
)
def test_file_lines_map_to_buffer_lines(nvim, buffer, expected, differs):
    # Lua drops the integer keys on the way back (they become a list): send pairs instead.
    mapping, changed = nvim.exec_lua(
        "local map, differs = require('skyline.anchors').file_to_buffer(...)\n"
        "local pairs_ = {}\n"
        "for line, row in pairs(map) do table.insert(pairs_, {line, row}) end\n"
        "return {pairs_, differs}",
        FILE,
        buffer,
    )
    assert dict(mapping) == expected
    assert changed is differs
