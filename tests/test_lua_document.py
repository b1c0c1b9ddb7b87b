"""lua/skyline/document.lua (the analysis document's LuaLS classes) and docs/analysis-document.md
describe the same fields: walking the classes from `skyline.AnalysisDocument` through the fields
typed with another class reaches every object the doc describes, each with the doc's fields."""

from __future__ import annotations

import re
from pathlib import Path

from test_document_fields import described_fields

REPO = Path(__file__).resolve().parent.parent
ANNOTATIONS = REPO / "lua" / "skyline" / "document.lua"
DOC = REPO / "docs" / "analysis-document.md"


def classes(source: str) -> dict[str, dict[str, str]]:
    """{class: {field: type}} of the `---@class` and `---@field` lines, a parent's fields included."""
    fields: dict[str, dict[str, str]] = {}
    parents: dict[str, str] = {}
    current = None
    for line in source.splitlines():
        declared = re.match(r"---@class ([\w.]+)(?:\s*:\s*([\w.]+))?", line)
        field = re.match(r"---@field (\w+) (\S+)", line)
        if declared:
            current = declared[1]
            fields[current] = {}
            if declared[2]:
                parents[current] = declared[2]
        elif field and current:
            fields[current][field[1]] = field[2]
    for name, parent in parents.items():
        fields[name] = {**fields[parent], **fields[name]}
    return fields


def annotated_fields(found: dict[str, dict[str, str]]) -> tuple[set[tuple[str, str]], set[str]]:
    """(where, field) as described_fields names them, reached from the document's class through
    the fields typed with a class (`skyline.X`, a list `skyline.X[]`); and the classes reached. The
    operation tree's nodes are all `operations`, as the doc describes them."""
    fields: set[tuple[str, str]] = set()
    seen: set[tuple[str, str]] = set()
    pending = [("", "skyline.AnalysisDocument")]
    while pending:
        where, name = pending.pop()
        where = re.sub(r"^operations(\.children\[\])+", "operations", where)
        if (where, name) in seen:
            continue
        seen.add((where, name))
        for field, kind in found[name].items():
            fields.add((where, field))
            typed = re.fullmatch(r"(skyline\.\w+)(\[\])?\??", kind)
            if typed and typed[1] in found:
                below = f"{where}.{field}" if where else field
                pending.append((below + ("[]" if typed[2] else ""), typed[1]))
    return fields, {name for _, name in seen}


def test_the_lua_classes_hold_the_fields_the_doc_describes():
    found = classes(ANNOTATIONS.read_text())
    annotated, reached = annotated_fields(found)
    described = described_fields(DOC.read_text())
    assert sorted(described - annotated) == [], "described in the doc, not annotated in document.lua"
    assert sorted(annotated - described) == [], "annotated in document.lua, not described in the doc"
    assert sorted(set(found) - reached) == [], "classes no field of the document reaches"
