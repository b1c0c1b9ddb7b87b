"""Every parameter at the edges of docs/protocol.md's "Parameter values" table, through the
dispatcher's own parameter lists: the last value in, the first one out, and the message the client
reads (written here from the docs, not from the code).

In process and fast: the checks run before any engine is involved (the same lists serve the real
service; tests/test_service_stdio.py sends wrong parameters to it).
"""

from __future__ import annotations

import pytest

from skyline_engine.service import dispatcher as methods
from skyline_engine.service.params import validate
from skyline_engine.service.protocol import RpcError

PATH_LIMIT = 4096
BATCH_LIMIT = 2147483647

# (method's parameters, parameter, value accepted, what the service takes it as)
ACCEPTED = [
    (methods.INITIALIZE, "protocol_version", 1, 1),
    (methods.CANCEL, "analysis_id", 0, 0),
    (methods.CANCEL, "analysis_id", -3, -3),
    (methods.INITIALIZE, "token", "t", "t"),
    (methods.ANALYZE, "entry_point", "a" * PATH_LIMIT, "a" * PATH_LIMIT),
    (methods.ANALYZE, "entry_point", "é" * (PATH_LIMIT // 2), "é" * (PATH_LIMIT // 2)),  # 4096 bytes
    (methods.INITIALIZE, "client_root", "/" + "r" * (PATH_LIMIT - 1), "/" + "r" * (PATH_LIMIT - 1)),
    (methods.ANALYZE, "batch_size", 1, 1),
    (methods.PREDICT, "batch_size", BATCH_LIMIT, BATCH_LIMIT),
    (methods.ANALYZE, "world_size", 1, 1),
    (methods.ANALYZE, "world_size", 64, 64),
    (methods.ANALYZE, "time_limit_s", 1e-6, 1e-6),
    (methods.ANALYZE, "time_limit_s", 30, 30.0),
    (methods.ANALYZE, "time_limit_s", 9_999_999.5, 9_999_999.5),
    (methods.ANALYZE, "memory_capacity_bytes", 1, 1),
    (methods.ANALYZE, "memory_capacity_bytes", 2**62 - 1, 2**62 - 1),
    (methods.ANALYZE, "script_args", [], ()),
    (methods.ANALYZE, "script_args", ["--epochs", "1", ""], ("--epochs", "1", "")),
    (methods.ANALYZE, "script_args", ["a"] * 1000, ("a",) * 1000),
    (methods.ANALYZE, "script_args", ["é" * (PATH_LIMIT // 2)], ("é" * (PATH_LIMIT // 2),)),
]

INTEGER = "an integer"
TEXT = "a non-empty string without NUL characters"
PATH = "a path of at most 4096 bytes"
BATCH = "an integer from 1 to 2147483647"
WORLD = "an integer from 1 to 64"
SECONDS = "a positive number of seconds"
BYTES = "a positive number of bytes"
ARGUMENTS = "a list of at most 1000 strings without NUL characters, each at most 4096 bytes"

# (method's parameters, parameter, value refused, what the message says it must be, how it names the value)
REFUSED = [
    (methods.INITIALIZE, "protocol_version", True, INTEGER, "a boolean"),
    (methods.INITIALIZE, "protocol_version", 1.0, INTEGER, "1.0"),
    (methods.CANCEL, "analysis_id", "3", INTEGER, "'3'"),
    (methods.INITIALIZE, "token", "", TEXT, "''"),
    (methods.INITIALIZE, "token", "se\0cret", TEXT, "'se\\x00cret'"),
    (methods.INITIALIZE, "token", 42, TEXT, "42"),
    (methods.ANALYZE, "entry_point", "", TEXT, "''"),
    (methods.ANALYZE, "entry_point", "entry\0point.py", TEXT, "'entry\\x00point.py'"),
    (methods.ANALYZE, "entry_point", ["entry_point.py"], TEXT, "an array"),
    (methods.ANALYZE, "entry_point", "a" * (PATH_LIMIT + 1), PATH, "'" + "a" * 59 + "…"),
    (methods.INITIALIZE, "client_root", "é" * (PATH_LIMIT // 2) + "a", PATH, "'" + "é" * 59 + "…"),
    (methods.ANALYZE, "batch_size", 0, BATCH, "0"),
    (methods.ANALYZE, "batch_size", -1, BATCH, "-1"),
    (methods.PREDICT, "batch_size", BATCH_LIMIT + 1, BATCH, "2147483648"),
    (methods.PREDICT, "batch_size", True, BATCH, "a boolean"),
    (methods.PREDICT, "batch_size", 32.0, BATCH, "32.0"),
    (methods.PREDICT, "batch_size", "32", BATCH, "'32'"),
    (methods.ANALYZE, "world_size", 0, WORLD, "0"),
    (methods.ANALYZE, "world_size", 65, WORLD, "65"),
    (methods.ANALYZE, "world_size", True, WORLD, "a boolean"),
    (methods.ANALYZE, "world_size", 2.0, WORLD, "2.0"),
    (methods.ANALYZE, "time_limit_s", 0, SECONDS, "0"),
    (methods.ANALYZE, "time_limit_s", -1.5, SECONDS, "-1.5"),
    (methods.ANALYZE, "time_limit_s", 10_000_000, SECONDS, "10000000"),
    (methods.ANALYZE, "time_limit_s", True, SECONDS, "a boolean"),
    (methods.ANALYZE, "time_limit_s", "30", SECONDS, "'30'"),
    (methods.ANALYZE, "memory_capacity_bytes", 0, BYTES, "0"),
    (methods.ANALYZE, "memory_capacity_bytes", 2**62, BYTES, str(2**62)),
    (methods.ANALYZE, "memory_capacity_bytes", True, BYTES, "a boolean"),
    (methods.ANALYZE, "memory_capacity_bytes", 1.5e9, BYTES, "1500000000.0"),
    (methods.ANALYZE, "script_args", "--epochs 1", ARGUMENTS, "'--epochs 1'"),
    (methods.ANALYZE, "script_args", ["--epochs", 1], ARGUMENTS, "an array"),
    (methods.ANALYZE, "script_args", ["a\0b"], ARGUMENTS, "an array"),
    (methods.ANALYZE, "script_args", ["a"] * 1001, ARGUMENTS, "an array"),
    (methods.ANALYZE, "script_args", ["a" * (PATH_LIMIT + 1)], ARGUMENTS, "an array"),
]

REQUIRED = {"entry_point": "entry_point.py", "protocol_version": 1, "batch_size": 8, "analysis_id": 1}


def with_required(spec, **values):
    """`values`, plus what `spec` requires that they leave out."""
    required = {param.name: REQUIRED[param.name] for param in spec if param.required}
    return {**required, **values}


@pytest.mark.parametrize(("spec", "name", "value", "taken"), ACCEPTED)
def test_the_last_value_in(spec, name, value, taken):
    checked = validate(with_required(spec, **{name: value}), spec)
    assert checked[name] == taken and type(checked[name]) is type(taken)


@pytest.mark.parametrize(("spec", "name", "value", "must_be", "shown"), REFUSED)
def test_the_first_value_out_is_named_with_what_it_must_be(spec, name, value, must_be, shown):
    with pytest.raises(RpcError) as refused:
        validate(with_required(spec, **{name: value}), spec)
    assert refused.value.to_wire() == {
        "code": "invalid_params",
        "message": f"`{name}` must be {must_be}, not {shown}",
        "param": name,
    }


@pytest.mark.parametrize(
    ("spec", "name"),
    [
        (methods.INITIALIZE, "protocol_version"),
        (methods.ANALYZE, "entry_point"),
        (methods.PREDICT, "batch_size"),
        (methods.CANCEL, "analysis_id"),
    ],
)
@pytest.mark.parametrize("absent", ["left out", "nil"])
def test_a_required_parameter_left_out_or_nil_is_named(spec, name, absent):
    params = with_required(spec)
    if absent == "left out":
        del params[name]
    else:
        params[name] = None
    with pytest.raises(RpcError) as refused:
        validate(params, spec)
    assert refused.value.to_wire() == {"code": "invalid_params", "message": f"`{name}` is required", "param": name}


def test_optional_parameters_left_out_or_nil_are_absent_and_unknown_ones_ignored():
    checked = validate({"entry_point": "e.py", "batch_size": None, "colour": "blue"}, methods.ANALYZE)
    assert checked == {
        "entry_point": "e.py",
        "batch_size": None,
        "time_limit_s": None,
        "memory_capacity_bytes": None,
        "world_size": None,
        "script_args": None,
    }
