"""docs/analysis-document.md, the shape the engine declares (analysis/document.py) and the
documents it writes hold the same fields.

The doc describes each object in a table under a heading that names where the object lies
(`models.samples[]` is an element of `models.samples`; several places may share one table). A real
analysis of the default example (complete, with its timeline, and its first partial document), and
one of data-parallel training on two ranks, are walked field by field: every field written must be
described, and every field described must be written. The declared TypedDicts name the fields the
doc describes, no more and no fewer, and every document written has their shape: each declared
field there (`timeline` only when asked for), nothing else, each value of its declared type.
"""

from __future__ import annotations

import copy
import dataclasses
import re
import sys
import types
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

import pytest

from engine_helpers import QUICK, analysed
from skyline_engine import vocabulary
from skyline_engine.analysis.document import DocumentDict
from skyline_engine.analysis.known_memory import KnownMemory
from skyline_engine.analysis.session import AnalysisRequest, analyze
from test_recommendation import straight, tiny_analysis

REPO = Path(__file__).resolve().parent.parent
DOC = REPO / "docs" / "analysis-document.md"

Fields = set[tuple[str, str]]  # (where, field): "" is the top level


def described_fields(markdown: str) -> Fields:
    """(where, field) for every row of every table that follows a heading naming where it lies."""
    fields: Fields = set()
    places: list[str] = []
    for line in markdown.splitlines():
        if line.startswith("#"):
            places = [""] if line.strip("# ").lower() == "top level" else re.findall(r"`([\w.\[\]]+)`", line)
            in_table = False
        elif line.startswith("|") and places:
            first_cell = re.split(r"(?<!\\)\|", line)[1]
            if set(first_cell.strip()) <= set("-: "):
                in_table = True  # the separator row: the rows below describe fields
                continue
            if in_table:
                for name in re.findall(r"`(\w+)`", first_cell):
                    fields.update((place, name) for place in places)
    return fields


def described_as(where: str) -> str:
    """The place a field is described at: the operation tree's nodes (`operations.children[]…`)
    are all described as `operations`."""
    return re.sub(r"^operations(\.children\[\])+", "operations", where)


def written_fields(document: Any, where: str = "") -> Fields:
    """(where, field) for every field of a document, lists as `[]`."""
    where = described_as(where)
    fields: Fields = set()
    if isinstance(document, dict):
        for key, value in document.items():
            fields.add((where, key))
            fields |= written_fields(value, f"{where}.{key}" if where else key)
    elif isinstance(document, list):
        for item in document:
            fields |= written_fields(item, where + "[]")
    return fields


# The declared types are evaluated by `typing`, which reads `int | None` from Python 3.10 on.
needs_310 = pytest.mark.skipif(sys.version_info < (3, 10), reason="typing evaluates `X | None` from Python 3.10")


def declared_fields(shape: Any, where: str = "", within: tuple[Any, ...] = ()) -> Fields:
    """(where, field) for every field of a TypedDict and of those it holds, lists as `[]`; a
    TypedDict within itself (the operation tree's `children`) is walked once."""
    fields: Fields = set()
    for name, declared in get_type_hints(shape).items():
        fields.add((described_as(where), name))
        fields |= _declared_within(declared, f"{where}.{name}" if where else name, (*within, shape))
    return fields


def _declared_within(declared: Any, where: str, within: tuple[Any, ...]) -> Fields:
    if _is_typeddict(declared):
        return set() if declared in within else declared_fields(declared, where, within)
    if get_origin(declared) is list:
        return _declared_within(get_args(declared)[0], where + "[]", within)
    if get_origin(declared) in (Union, types.UnionType):
        return set().union(*(_declared_within(each, where, within) for each in get_args(declared)))
    return set()


def _is_typeddict(declared: Any) -> bool:
    return isinstance(declared, type) and issubclass(declared, dict) and hasattr(declared, "__required_keys__")


def mismatches(value: Any, declared: Any, where: str = "document") -> list[str]:
    """Where `value` (JSON-ready data) is not of the `declared` type: a field missing or not
    declared, a value of another type, a string outside its Literal."""
    origin, args = get_origin(declared), get_args(declared)
    if _is_typeddict(declared):
        if not isinstance(value, dict):
            return [f"{where}: {type(value).__name__}, not an object"]
        hints = get_type_hints(declared)
        problems = [f"{where}.{name}: missing" for name in sorted(declared.__required_keys__ - value.keys())]
        problems += [f"{where}.{name}: not declared" for name in sorted(value.keys() - hints.keys())]
        for name in sorted(value.keys() & hints.keys()):
            problems += mismatches(value[name], hints[name], f"{where}.{name}")
        return problems
    if origin is list:
        if not isinstance(value, list):
            return [f"{where}: {type(value).__name__}, not a list"]
        return [problem for i, item in enumerate(value) for problem in mismatches(item, args[0], f"{where}[{i}]")]
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return []
        others = [each for each in args if each is not type(None)]
        if len(others) == 1:
            return mismatches(value, others[0], where)
        return [] if any(not mismatches(value, each, where) for each in others) else [f"{where}: {value!r}"]
    if origin is Literal:
        return [] if value in args else [f"{where}: {value!r}, not one of {', '.join(map(repr, args))}"]
    numbers = (int, float) if declared is float else (declared,)  # an int is a float's value too
    if declared not in (int, float, str, bool):
        raise TypeError(f"{where}: no check for {declared!r}")
    if isinstance(value, bool) != (declared is bool) or not isinstance(value, numbers):
        return [f"{where}: {value!r}, not {declared.__name__}"]
    return []


@pytest.fixture(scope="module")
def documents() -> list[dict[str, Any]]:
    """The default example's complete document and first partial one, a document with memory-only
    probes (tests/projects/branching) and the next one of the same code (`reused`), one of
    data-parallel training, one of a compiled model, one of an iteration that keeps memory for
    good, and one whose confirming step timed batch sizes beside the user's (`models.checks`: a
    tiny model with injected times, test_recommendation.py)."""
    partials: list[dict[str, Any]] = []
    request = AnalysisRequest("examples/default/entry_point.py", REPO, device="cpu", budget=QUICK, timeline=True)
    complete = analyze(request, partial=lambda document: partials.append(document.to_dict())).to_dict()
    assert complete["models"] is not None and complete["timeline"] and complete["optimizer_state"]
    branching = REPO / "tests" / "projects" / "branching"
    handed: list[KnownMemory] = []
    request = AnalysisRequest("entry_point.py", branching, device="cpu", budget=QUICK)
    probed = analyze(request, remember=handed.append).to_dict()
    assert probed["models"]["memory_samples"]
    # The service's next analysis of the same code, given what this one measured.
    reused = analyze(dataclasses.replace(request, known_memory=handed[-1])).to_dict()
    assert reused["reused"]["memory_batch_sizes"]
    data_parallel = REPO / "tests" / "projects" / "data_parallel"
    ranks = analysed(data_parallel, world_size=2)
    assert ranks["distributed"]["buckets"]
    training_loops = REPO / "tests" / "projects" / "training_loops"
    compiled = analysed(training_loops, "compiled.py", predict=False)
    assert compiled["compilation"]["batch_sizes"]
    leaks = analysed(training_loops, "keeps_graphs.py", predict=False)
    assert leaks["memory_growth"]["lines"]
    checked = tiny_analysis(straight)
    assert checked["models"]["checks"] and checked["models"]["recommendation"]["batch_size"]
    return [complete, partials[0], probed, reused, ranks, compiled, leaks, checked]


@pytest.mark.slow
def test_every_field_written_is_described(documents):
    described = described_fields(DOC.read_text(encoding="utf-8"))
    for document in documents:
        assert sorted(written_fields(document) - described) == []


@pytest.mark.slow
def test_every_field_described_is_written(documents):
    described = described_fields(DOC.read_text(encoding="utf-8"))
    written = set().union(*(written_fields(document) for document in documents))
    assert sorted(described - written) == []


@pytest.mark.slow
def test_the_check_sees_an_undocumented_field_anywhere(documents):
    described = described_fields(DOC.read_text(encoding="utf-8"))
    changed = copy.deepcopy(documents[0])
    changed["iteration"]["new_figure"] = 1
    changed["operations"]["children"][0]["children"][0]["extra"] = True
    changed["predictions"][0]["measured"]["also"] = 2
    assert sorted(written_fields(changed) - described) == [
        ("iteration", "new_figure"),
        ("operations", "extra"),
        ("predictions[].measured", "also"),
    ]


@needs_310
def test_the_declared_shape_is_the_documented_one():
    """Each field the doc describes is declared where it lies, and each declared field is described."""
    described = described_fields(DOC.read_text(encoding="utf-8"))
    assert sorted(declared_fields(DocumentDict) - described) == []
    assert sorted(described - declared_fields(DocumentDict)) == []


@needs_310
@pytest.mark.slow  # real analyses
def test_every_document_written_has_the_declared_shape(documents):
    for document in documents:
        assert mismatches(document, DocumentDict) == []


@needs_310
@pytest.mark.slow  # real analyses
def test_the_shape_check_sees_a_value_that_breaks_it(documents):
    changed = copy.deepcopy(documents[0])
    changed["device"]["extra"] = 1
    changed["iteration"]["peak_memory_phase"] = "sideways"
    del changed["lines"][0]["inclusive"]["step_ms"]
    changed["models"]["trusted_range"][1] = 2.5
    changed["operations"]["children"][0]["kind"] = "layer"
    changed["predictions"][0]["fits"] = 1
    changed["predictions"][0]["measured"] = {"batch_size": 8}  # an object, but not a measurement
    del changed["timeline"]  # the one field that may be left out
    missing = ["micro_batches", "page_faults_per_iteration", "peak_memory_bytes", "peak_memory_phase"]
    missing += ["peak_memory_reserved_bytes"]
    missing += ["repetitions", "run_time_iqr_ms", "run_time_ms", "samples_per_second"]
    assert [problem.split(":")[0] for problem in mismatches(changed, DocumentDict)] == [
        "document.device.extra",
        "document.iteration.peak_memory_phase",
        "document.lines[0].inclusive.step_ms",
        "document.models.trusted_range[1]",
        "document.operations.children[0].kind",
        "document.predictions[0].fits",
        *(f"document.predictions[0].measured.{name}" for name in missing),
    ]


def test_the_declared_phases_are_the_vocabularys():
    """The Literal types the declared shape reads phases as hold the vocabulary's constants, which
    the labels name (mypy checks the labels' keys against the Literals the other way)."""
    peak = {vocabulary.FORWARD_BACKWARD, vocabulary.OPTIMIZER, vocabulary.OTHER}
    operation = {vocabulary.FORWARD, vocabulary.BACKWARD, vocabulary.OPTIMIZER}
    assert set(get_args(vocabulary.PeakPhase)) == peak == set(vocabulary.PEAK_PHASE_LABELS)
    assert set(get_args(vocabulary.OperationPhase)) == operation == set(vocabulary.TENSOR_KIND_LABELS)


def test_the_reader_of_the_doc_finds_shared_and_nested_tables():
    markdown = """
## Top level

| field | type |
|---|---|
| `a` | x |

## A thing: `a`, `b[].c`

Text with `code` that is no field.

| field | meaning |
|---|---|
| `x`, `y` | both, with a `\\|` inside |

## Prose only: `z`
"""
    assert described_fields(markdown) == {("", "a"), ("a", "x"), ("a", "y"), ("b[].c", "x"), ("b[].c", "y")}
