"""What the editor's halves and the engine must agree on. Lua against Python, compared in a real
headless Neovim: the shared constants (lua/skyline/constants.lua), the models' formula, byte
formatting, the batch_size literal locator and the address forms of :SkylineConnect. The remote
plugin against the service: the protocol's version and message kinds. A value that drifts in one
place fails here."""

import argparse
import ast
import sys
from pathlib import Path

import pytest

from nvim_helpers import as_lua_receives
from skyline_engine import vocabulary
from skyline_engine.cli.arguments import parse_size
from skyline_engine.cli.serve import parse_listen
from skyline_engine.entry.batch_size import find_batch_size_location
from skyline_engine.entry.contract import BATCH_SIZE_PARAMETER, INPUT_PROVIDER, PROVIDERS
from skyline_engine.predict.batch_models import (
    CLOSE_FIT_RESIDUAL,
    MAX_SPREAD,
    POOR_FIT_R2,
    BatchSizeModels,
    usable_memory_bytes,
)
from skyline_engine.render.terminal import NOTABLE_OTHER_TENSOR
from skyline_engine.service import protocol
from skyline_engine.service.params import MAX_BATCH_SIZE
from skyline_engine.service.tokens import default_token_path
from skyline_engine.units import format_bytes


def test_the_remote_plugin_speaks_the_services_protocol(monkeypatch):
    # The remote plugin keeps its own copy (it never imports the engine, which may live in
    # another interpreter); these are the values both ends put on the wire.
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parent.parent / "rplugin" / "python3"))
    monkeypatch.delitem(sys.modules, "skyline_rplugin.connection", raising=False)
    from skyline_rplugin import connection

    assert connection.PROTOCOL_VERSION == protocol.PROTOCOL_VERSION
    assert (connection.REQUEST, connection.RESPONSE, connection.NOTIFICATION) == (
        protocol.REQUEST,
        protocol.RESPONSE,
        protocol.NOTIFICATION,
    )


def test_shared_constants(nvim):
    lua = nvim.exec_lua(
        "local c = require('skyline.constants')\n"
        "return {PROVIDERS = c.PROVIDERS, INPUT_PROVIDER = c.INPUT_PROVIDER,"
        " BATCH_SIZE_PARAMETER = c.BATCH_SIZE_PARAMETER, MAX_BATCH_SIZE = c.MAX_BATCH_SIZE,"
        " POOR_FIT_R2 = c.POOR_FIT_R2, CLOSE_FIT_RESIDUAL = c.CLOSE_FIT_RESIDUAL, MAX_SPREAD = c.MAX_SPREAD}"
    )
    assert lua["PROVIDERS"] == list(PROVIDERS)
    assert lua["INPUT_PROVIDER"] == INPUT_PROVIDER
    assert lua["BATCH_SIZE_PARAMETER"] == BATCH_SIZE_PARAMETER
    assert lua["MAX_BATCH_SIZE"] == MAX_BATCH_SIZE
    assert lua["POOR_FIT_R2"] == POOR_FIT_R2
    assert lua["CLOSE_FIT_RESIDUAL"] == CLOSE_FIT_RESIDUAL
    assert lua["MAX_SPREAD"] == MAX_SPREAD


def test_shared_vocabulary(nvim):
    """The phases and kinds of tensors, and how both read, are the same words in the terminal and
    the float."""
    names = ["FORWARD_BACKWARD", "OPTIMIZER", "OTHER", "FORWARD", "BACKWARD", "FORWARD_ONLY_LABEL"]
    tables = ["PEAK_PHASE_LABELS", "TENSOR_KIND_LABELS"]
    lua = nvim.exec_lua(
        "local c = require('skyline.constants')\nlocal out = {}\n"
        "for _, name in ipairs(...) do out[name] = c[name] end\nreturn out",
        names + tables,
    )
    for name in names + tables:
        assert lua[name] == getattr(vocabulary, name), name
    assert nvim.exec_lua("return require('skyline.constants').NOTABLE_OTHER_TENSOR") == NOTABLE_OTHER_TENSOR


@pytest.mark.parametrize("state_home", ["/tmp/skyline-parity-state", "", None])
def test_default_token_path(nvim, monkeypatch, state_home):
    # Both sides read the same HOME: the editor inherits this process's environment.
    if state_home is None:
        monkeypatch.delenv("XDG_STATE_HOME", raising=False)
        nvim.exec_lua("vim.env.XDG_STATE_HOME = nil")
    else:
        monkeypatch.setenv("XDG_STATE_HOME", state_home)
        nvim.exec_lua("vim.env.XDG_STATE_HOME = ...", state_home)
    lua = nvim.exec_lua("return require('skyline.constants').default_token_path()")
    assert lua == str(default_token_path())
    if state_home:
        assert lua == "/tmp/skyline-parity-state/skyline/token"


# --- the models' formula --------------------------------------------------------------------


def document_models(
    run_time, memory, capacity, headroom=0.10, measured=(16, 32, 64), phases=None, r2=None, residual=0.0
):
    """An analysis document's `models`, as far as a prediction reads it; `phases` are the memory
    model's curves as (name, slope, bias) or (name, slope, bias, quadratic), by default the one
    line `memory`."""
    lines = phases or [("forward_backward", *memory)]
    return {
        "samples": [{"batch_size": b} for b in measured],
        "memory_samples": [],
        "run_time_ms": {
            "slope": run_time[0],
            "bias": run_time[1],
            "r2": r2,
            "max_relative_residual": residual,
            "points": len(measured),
        },
        "peak_memory_bytes": {
            "slope": memory[0],
            "bias": memory[1],
            "r2": None,
            "max_relative_residual": 0.0,
            "points": len(measured),
            "fitted": "per_operation",
            "phases": [
                {"name": n, "slope": s, "bias": b, "r2": None, **({"quadratic": q[0]} if q else {})}
                for n, s, b, *q in lines
            ],
            "phase_at_max_batch_size": lines[-1][0],
        },
        "memory_headroom_fraction": headroom,
        "usable_memory_bytes": usable_memory_bytes(capacity, headroom),
        "trusted_range": [min(measured), 4 * max(measured)],
    }


MODEL_CASES = [
    # the default example on a CPU, roughly
    (document_models((0.0136, 0.26), (1032.0, 8470000.0), 25275969536), [1, 7, 64, 128, 1000, MAX_BATCH_SIZE]),
    # a negative bias: throughput falls with the batch size, and the run time is not positive
    # below 10 (no time and no throughput there, never a negative one)
    (document_models((1.0, -10.0), (4096.0, -1000.0), 1 << 20), [1, 9, 10, 11, 255, 256, 300]),
    # memory that does not grow; a line through zero
    (document_models((0.5, 0.0), (0.0, 123456.0), 1 << 30, headroom=0.25), [1, 2, 3, 1 << 20]),
    # a flat run time of zero: no time or throughput anywhere
    (document_models((0.0, 0.0), (10.0, 0.0), 1000), [1, 100]),
    # a falling run time (noise, a bottleneck elsewhere): no time or throughput anywhere
    (document_models((-0.1, 50.0), (10.0, 0.0), 1000), [1, 64, 256]),
    # a line through noise (R² below 0.95, a time missed by 5 %): no time or throughput; one that
    # fits, at 0.95 exactly; one with a low R² that misses no time by more than 1 %
    (document_models((0.5, 2.0), (10.0, 0.0), 1000, r2=0.94, residual=0.05), [1, 64]),
    (document_models((0.5, 2.0), (10.0, 0.0), 1000, r2=0.95, residual=0.05), [1, 64]),
    (document_models((0.5, 2.0), (10.0, 0.0), 1000, r2=0.5, residual=0.01), [1, 64]),
    # an optimizer-dominated peak: flat in the step up to 682 samples, then backward's steeper line
    (
        document_models(
            (0.1, 1.0),
            (54 * 1024.0, 200 * 2**20),
            1 << 30,
            phases=[("optimizer", 6 * 1024.0, 232 * 2**20), ("forward_backward", 54 * 1024.0, 200 * 2**20)],
        ),
        [1, 16, 682, 683, 1000, 15625, 15626, 20000],
    ),
    # a contrastive loss: the optimizer's line up to 352 samples, then a batch × batch logits
    # matrix's quadratic (20 B × b² + 17 KiB × b + 10.5 MiB); time trusted up to the largest timed
    (
        {
            **document_models(
                (0.0618, -2.37),
                (17408.0, 11010048.0),
                1 << 30,
                measured=(256, 512, 1024),
                phases=[
                    ("optimizer", 5120.0, 17825792.0),
                    ("forward_backward", 17408.0, 11010048.0, 20.0),
                ],
            ),
            "trusted_range": [256, 1024],
        },
        [1, 256, 352, 353, 1024, 1025, 6489, 6490, 10**5],
    ),
    # the user's code failed at 1 and at 16: time and memory trusted up to 15 only; a failure
    # beyond 4× the largest measured ends nothing
    (
        {
            **document_models((0.5, 2.0), (10.0, 0.0), 1000, measured=(2, 4, 8)),
            "trusted_range": [2, 15],
            "failing_batch_sizes": [1, 16],
        },
        [1, 2, 15, 16, 17],
    ),
    ({**document_models((0.5, 2.0), (10.0, 0.0), 1000, measured=(2, 4, 8)), "failing_batch_sizes": [34]}, [32, 33]),
    # a probe past the timed batch sizes off the line, none affordable, one on the line short of 4 × 8
    (
        {
            **document_models((0.5, 2.0), (10.0, 0.0), 1000, measured=(2, 4, 8)),
            "trusted_range": [2, 8],
            "line_bends_at": 20,
        },
        [8, 9, 20],
    ),
    (
        {
            **document_models((0.5, 2.0), (10.0, 0.0), 1000, measured=(2, 4, 8)),
            "trusted_range": [2, 8],
            "range_unprobed": True,
        },
        [8, 9],
    ),
    (
        {
            **document_models((0.5, 2.0), (10.0, 0.0), 1000, measured=(2, 4, 8)),
            "trusted_range": [2, 20],
            "range_probed_to": 20,
        },
        [20, 21],
    ),
    # batch sizes timed past the largest timed after the models were fitted: predictions past 8 follow
    # them, one segment to each, and the line moved by the last one's miss beyond (the user's 4
    # again, below 8, changes nothing)
    (
        {
            **document_models((0.5, 2.0), (10.0, 0.0), 1000, measured=(2, 4, 8)),
            "checks": [
                {"batch_size": 4, "run_time_ms": 4.1, "micro_batches": 1},
                {"batch_size": 32, "run_time_ms": 21.0, "micro_batches": 1},
                {"batch_size": 16, "run_time_ms": 11.0, "micro_batches": 1},
                # its blocks spread 30 % of their mean: no correction
                {"batch_size": 24, "run_time_ms": 40.0, "run_time_iqr_ms": 12.0, "micro_batches": 1},
            ],
        },
        [4, 8, 9, 16, 20, 24, 32, 33, 100],
    ),
    # accumulation to 256 samples a step, 128 timed at two micro-batches of 2 ms
    (
        {
            **document_models((0.0136, 0.26), (1032.0, 8470000.0), 25275969536),
            "samples_per_step": 256,
            "checks": [{"batch_size": 128, "run_time_ms": 4.0, "micro_batches": 2}],
        },
        [64, 100, 128, 200, 256],
    ),
    # gradient accumulation: four micro-batches of b samples per iteration
    ({**document_models((0.0136, 0.26), (1032.0, 8470000.0), 25275969536), "micro_batches": 4}, [1, 64, 1000]),
    # accumulation to 256 samples a step: the line is one micro-batch's, b runs 256 / b of them
    (
        {**document_models((0.0136, 0.26), (1032.0, 8470000.0), 25275969536), "samples_per_step": 256},
        [1, 64, 256, 257, 1000],
    ),
]


def test_predictions_match_the_engine(nvim):
    cases = [(models, b) for models, sizes in MODEL_CASES for b in sizes]
    lua = nvim.exec_lua(
        "local predict = require('skyline.models').predict\n"
        "return vim.tbl_map(function(case) return predict(case[1], case[2]) end, ...)",
        [[as_lua_receives(models), b] for models, b in cases],
    )
    for (models, b), got in zip(cases, lua):
        engine = BatchSizeModels.from_dict(models, _capacity(models)).predict(b).to_dict()
        # The remote plugin drops None-valued keys before Lua sees a document; a Lua nil is a
        # missing key on the way back.
        expected = {key: value for key, value in engine.items() if value is not None}
        assert got.keys() == expected.keys(), (b, got, engine)
        for key, value in expected.items():
            assert got[key] == pytest.approx(value, rel=1e-12, abs=0), (key, b, got, engine)


def test_what_ends_the_trusted_range_is_named_alike(nvim):
    cases = [models for models, _ in MODEL_CASES]
    lua = nvim.exec_lua(
        "local models = require('skyline.models')\n"
        "return vim.tbl_map(function(m) return models.trusted_range_end(m) end, ...)",
        [as_lua_receives(models) for models in cases],
    )
    engine = [BatchSizeModels.from_dict(models, _capacity(models)).trusted_range_end for models in cases]
    assert lua == engine
    # lines, a quadratic, a failure of the user's code, the samples per step, a probe off the line,
    # none affordable, one short of the end
    assert len(set(engine)) == 7


def _capacity(models):
    """A capacity whose usable share is the document's usable_memory_bytes (the inverse of
    usable_memory_bytes, checked)."""
    headroom = models["memory_headroom_fraction"]
    for capacity in (25275969536, 1 << 20, 1 << 30, 1000):  # the capacities of MODEL_CASES
        if usable_memory_bytes(capacity, headroom) == models["usable_memory_bytes"]:
            return capacity
    raise AssertionError("no capacity for these models")


# --- byte formatting ------------------------------------------------------------------------


def test_format_bytes_matches_the_engine(nvim):
    # Ties (x.5 bytes, x.25 and x.75 of a unit) round to even in Python's format: LuaJIT's alone
    # rounds them away from zero.
    values = [0, 0.25, 0.4, 0.5, 0.75, 1.5, 2.5, -0.5, -2.5, 512.5, 512.6, 999, 1000.4]
    values += [1023, 1023.4, 1023.5, 1023.96, -1023]
    for power in range(1, 7):
        unit = 1024**power
        values += [unit - 1, unit, unit + 1, unit * 1023.94, unit * 1023.96, unit * 1.05, unit * 1.25, unit * 1.75]
        values += [unit * 2.25, unit * 1023.95, -unit, -unit * 1.25]
    lua = nvim.exec_lua(
        "local bytes = require('skyline.format').bytes\nreturn vim.tbl_map(function(v) return bytes(v) end, ...)",
        values,
    )
    assert dict(zip(values, lua)) == {value: format_bytes(value) for value in values}
    # Written out, so that a bug both share fails too.
    fixed = {
        0: "0 B",
        1023: "1023 B",
        1024: "1.0 KiB",
        1024**2 - 1: "1024.0 KiB",
        1024**2: "1.0 MiB",
        3 * 1024**3 // 2: "1.5 GiB",
        1024**4: "1.0 TiB",
        1024**5: "1024.0 TiB",
        -2048: "-2.0 KiB",
    }
    lua_fixed = nvim.exec_lua(
        "local bytes = require('skyline.format').bytes\nreturn vim.tbl_map(function(v) return bytes(v) end, ...)",
        list(fixed),
    )
    assert lua_fixed == list(fixed.values())
    assert [format_bytes(value) for value in fixed] == list(fixed.values())
    assert nvim.exec_lua("return require('skyline.format').bytes(nil)") == format_bytes(None) == "—"


# --- the batch_size literal -----------------------------------------------------------------

ENTRY_POINTS = {
    "literal": "def skyline_input_provider(batch_size=128):\n    return batch_size\n",
    "keyword-only": "def skyline_input_provider(*, batch_size=64):\n    return batch_size\n",
    "positional-only": "def skyline_input_provider(batch_size=8, /):\n    return batch_size\n",
    "annotated": "def skyline_input_provider(batch_size: int = 32) -> tuple:\n    return (batch_size,)\n",
    "comment after": (
        "def skyline_input_provider(\n    batch_size=16,  # small, to start\n):\n    return batch_size\n"
    ),
    "multi-line signature": (
        "import torch\n\n\n"
        "def skyline_input_provider(\n"
        "    seed: int = 0,\n"
        "    batch_size: int = 256,\n"
        "    shape=(3, 32, 32),\n"
        ") -> tuple:\n"
        "    return (torch.randn(batch_size, *shape),)\n"
    ),
    "non-ASCII before the literal": (
        "# Données d'entraînement\n"
        'def skyline_input_provider(légende="é→ü", batch_size=48):\n'
        "    return légende, batch_size\n"
    ),
    "hexadecimal": "def skyline_input_provider(batch_size=0x80):\n    pass\n",
    "underscores": "def skyline_input_provider(batch_size=1_024):\n    pass\n",
    "negative": "def skyline_input_provider(batch_size=-4):\n    pass\n",
    "zero": "def skyline_input_provider(batch_size=0):\n    pass\n",
    "expression": "def skyline_input_provider(batch_size=2 ** 7):\n    pass\n",
    "a name": "N = 8\ndef skyline_input_provider(batch_size=N):\n    pass\n",
    "float": "def skyline_input_provider(batch_size=1.5):\n    pass\n",
    "boolean": "def skyline_input_provider(batch_size=True):\n    pass\n",
    "string": "def skyline_input_provider(batch_size='8'):\n    pass\n",
    "no default": "def skyline_input_provider(batch_size):\n    pass\n",
    "no provider": "def other(batch_size=16):\n    pass\n",
    "another function's default first": (
        "def helper(batch_size=4):\n    pass\n\n\ndef skyline_input_provider(batch_size=12):\n    pass\n"
    ),
    "the last provider counts": (
        "def skyline_input_provider(batch_size=16):\n    pass\n\n\n"
        "def skyline_input_provider(batch_size=24):\n    pass\n"
    ),
    "under a module-level if": (
        "import os\nif os.name:\n    def skyline_input_provider(batch_size=20):\n        pass\n"
    ),
    "the body names batch_size too": "def skyline_input_provider(n=2):\n    batch_size = 12\n    return batch_size\n",
}


def engine_location(source: str):
    """What the engine locates in `source`, run as the worker runs it: the default of the input
    provider that the module holds once executed (None without one)."""
    namespace: dict = {}
    exec(compile(source, "entry_point.py", "exec"), namespace)
    provider = namespace.get("skyline_input_provider")
    return find_batch_size_location(source, "entry_point.py", provider.__code__) if provider else None


@pytest.mark.parametrize("name", ENTRY_POINTS)
def test_the_literal_locator_matches_the_engine(nvim, name):
    source = ENTRY_POINTS[name]
    ast.parse(source)  # each is a valid entry point's text
    location = engine_location(source)
    found, why = nvim.exec_lua(
        "local found, why = require('skyline.literal').find(...)\nreturn {found or vim.NIL, why or vim.NIL}",
        source.split("\n"),
    )
    if location is not None and location.editable:
        assert found == {
            "row": location.line - 1,
            "col_start": location.col_start,
            "col_end": location.col_end,
            "value": location.value,
        }
    else:
        assert found is None, location
        # A default that is there but not a literal is explained; an absent one is not.
        assert (why is not None) == (location is not None), why


def test_forms_only_the_engine_locates(nvim):
    # The editor scans text; the engine parses it. A literal in parentheses or on the line after
    # its `=` is editable for the engine (the document's location covers it until the buffer is
    # edited) but not found by the scanner, which explains why instead of guessing.
    for source in (
        "def skyline_input_provider(batch_size=(128)):\n    pass\n",
        "def skyline_input_provider(batch_size=(\n    128\n)):\n    pass\n",
    ):
        assert engine_location(source).editable
        found, why = nvim.exec_lua(
            "local found, why = require('skyline.literal').find(...)\nreturn {found or vim.NIL, why or vim.NIL}",
            source.split("\n"),
        )
        assert found is None and "not an integer literal" in why


# --- :SkylineConnect's addresses ------------------------------------------------------------

ADDRESSES = {
    # what the editor, a client, accepts: written out
    "127.0.0.1:7070": ("127.0.0.1", 7070),
    "localhost:1": ("localhost", 1),
    "gpu-box.example:65535": ("gpu-box.example", 65535),
    "[::1]:7070": ("::1", 7070),
    "[fe80::1%eth0]:80": ("fe80::1%eth0", 80),
    "host:080": ("host", 80),
    # what it refuses (the server accepts some of them: a bare port, port 0)
    "7070": None,
    ":7070": None,
    "host:0": None,
    "host:65536": None,
    "[::1]:99999": None,
    "host:": None,
    "[::1]": None,
    "a:b:80": None,
    "a]b:80": None,
    "host:http": None,
    "": None,
}


def test_connect_addresses_match_the_server(nvim):
    lua = nvim.exec_lua(
        "local parse = require('skyline.util').parse_address\n"
        "return vim.tbl_map(function(text)\n"
        "  local host, port = parse(text)\n"
        "  return host and { host, port } or vim.NIL\n"
        "end, ...)",
        list(ADDRESSES),
    )
    got = {text: tuple(result) if result else None for text, result in zip(ADDRESSES, lua)}
    assert got == ADDRESSES
    for text, parsed in got.items():
        if parsed is not None:  # where both accept, they agree
            assert parse_listen(text) == parsed, text


# --- sizes (memory_capacity, --memory-capacity) -------------------------------------------------

SIZES = ["1073741824", "1", "0", "512MiB", "24GiB", "24gib", "8G", "8g", "512M", "4k", "4K", "80GB", "80gb", "500MB"]
SIZES += ["2kB", "1.5GiB", "0.5G", "100B", "100b", " 8 GiB ", "3Ki", "iB", "GiB", "8 X", "1.", ".5G", "-1", "8GiBs", ""]


def test_sizes_read_as_the_engine_reads_them(nvim):
    lua = nvim.exec_lua(
        "local parse = require('skyline.util').parse_size\n"
        "return vim.tbl_map(function(text) return parse(text) or vim.NIL end, ...)",
        SIZES,
    )
    for text, got in zip(SIZES, lua):
        try:
            expected = parse_size(text)
        except argparse.ArgumentTypeError:
            expected = None
        assert got == expected, text
    assert nvim.exec_lua("return require('skyline.util').parse_size(4096)") == 4096
    assert nvim.exec_lua("return require('skyline.util').parse_size(0.5)") is None
