"""docs/analysis-document.md and the documents the engine writes hold the same fields.

The doc describes each object in a table under a heading that names where the object lies
(`models.samples[]` is an element of `models.samples`; several places may share one table). A real
analysis of the default example (complete, with its timeline, and its first partial document), and
one of data-parallel training on two ranks, are walked field by field: every field written must be
described, and every field described must be written.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest

from engine_helpers import QUICK, analysed
from skyline_engine.analysis.session import AnalysisRequest, analyze

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


def written_fields(document: Any, where: str = "") -> Fields:
    """(where, field) for every field of a document, lists as `[]`; the operation tree's nodes
    (`operations.children[]…`) are all described as `operations`."""
    where = re.sub(r"^operations(\.children\[\])+", "operations", where)
    fields: Fields = set()
    if isinstance(document, dict):
        for key, value in document.items():
            fields.add((where, key))
            fields |= written_fields(value, f"{where}.{key}" if where else key)
    elif isinstance(document, list):
        for item in document:
            fields |= written_fields(item, where + "[]")
    return fields


@pytest.fixture(scope="module")
def documents() -> list[dict[str, Any]]:
    """The default example's complete document and first partial one, a document with memory-only
    probes (tests/projects/branching), one of data-parallel training, one of a compiled model and
    one of an iteration that keeps memory for good."""
    partials: list[dict[str, Any]] = []
    request = AnalysisRequest("examples/default/entry_point.py", REPO, device="cpu", budget=QUICK, timeline=True)
    complete = analyze(request, partial=lambda document: partials.append(document.to_dict())).to_dict()
    assert complete["models"] is not None and complete["timeline"] and complete["optimizer_state"]
    branching = REPO / "tests" / "projects" / "branching"
    probed = analysed(branching)
    assert probed["models"]["memory_samples"]
    data_parallel = REPO / "tests" / "projects" / "data_parallel"
    ranks = analysed(data_parallel, world_size=2)
    assert ranks["distributed"]["buckets"]
    training_loops = REPO / "tests" / "projects" / "training_loops"
    compiled = analysed(training_loops, "compiled.py", predict=False)
    assert compiled["compilation"]["batch_sizes"]
    leaks = analysed(training_loops, "keeps_graphs.py", predict=False)
    assert leaks["memory_growth"]["lines"]
    return [complete, partials[0], probed, ranks, compiled, leaks]


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
