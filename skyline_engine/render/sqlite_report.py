"""Skyline's SQLite reports (`skyline time` and `skyline memory`), in Skyline's documented schemas.

Queries written for Skyline's reports work unchanged on these files. Stack frames are the project
frames of each entry, innermost (most specific) first, paths relative to the project root.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Callable

from skyline_engine.analysis.document import DocumentDict, FrameDict, OperationNodeDict
from skyline_engine.render.files import write_atomic

# Skyline's report format version (PRAGMA user_version).
REPORT_FORMAT_VERSION = 1

WEIGHT_ENTRY = 1
ACTIVATION_ENTRY = 2

RUN_TIME_SCHEMA = """
CREATE TABLE run_time_entries (
  id INTEGER PRIMARY KEY,
  operation_name TEXT NOT NULL,
  forward_ms REAL NOT NULL,
  backward_ms REAL
);
CREATE TABLE stack_frames (
  ordering INTEGER NOT NULL,
  file_path TEXT NOT NULL,
  line_number INTEGER NOT NULL,
  entry_id INTEGER NOT NULL,
  PRIMARY KEY (entry_id, ordering)
);
"""

MEMORY_SCHEMA = """
CREATE TABLE weight_entries (
  id INTEGER PRIMARY KEY,
  name TEXT NOT NULL,
  size_bytes INTEGER NOT NULL,
  grad_size_bytes INTEGER NOT NULL
);
CREATE TABLE activation_entries (
  id INTEGER PRIMARY KEY,
  operation_name TEXT NOT NULL,
  size_bytes INTEGER NOT NULL
);
CREATE TABLE entry_types (
  entry_type INTEGER PRIMARY KEY,
  name TEXT NOT NULL
);
CREATE TABLE stack_correlation (
  correlation_id INTEGER PRIMARY KEY,
  entry_id INTEGER NOT NULL,
  entry_type INTEGER NOT NULL,
  UNIQUE (correlation_id, entry_id)
);
CREATE UNIQUE INDEX entry_type_and_id ON stack_correlation(entry_type, entry_id);
CREATE TABLE stack_frames (
  correlation_id INTEGER NOT NULL,
  ordering INTEGER NOT NULL,
  file_path TEXT NOT NULL,
  line_number INTEGER NOT NULL,
  PRIMARY KEY (correlation_id, ordering)
);
CREATE TABLE misc_sizes (
  key TEXT PRIMARY KEY,
  size_bytes INT NOT NULL
);
"""


def write_run_time_report(path: str | Path, document: DocumentDict) -> None:
    def fill(db: sqlite3.Connection) -> None:
        db.executescript(RUN_TIME_SCHEMA)
        for op in operation_leaves(document["operations"]):
            entry_id = db.execute(
                "INSERT INTO run_time_entries (operation_name, forward_ms, backward_ms) VALUES (?, ?, ?)",
                # Skyline's schema has no column for the update: its operations' time is forward time there.
                (op["name"], op["forward_ms"] + op.get("step_ms", 0.0), op["backward_ms"]),
            ).lastrowid
            db.executemany(
                "INSERT INTO stack_frames (ordering, file_path, line_number, entry_id) VALUES (?, ?, ?, ?)",
                [(i, c["path"], c["line"], entry_id) for i, c in enumerate(op["contexts"])],
            )

    _write_database(path, fill)


def write_memory_report(path: str | Path, document: DocumentDict) -> None:
    def fill(db: sqlite3.Connection) -> None:
        db.executescript(MEMORY_SCHEMA)
        db.executemany(
            "INSERT INTO entry_types (entry_type, name) VALUES (?, ?)",
            [(WEIGHT_ENTRY, "weight"), (ACTIVATION_ENTRY, "activation")],
        )
        for weight in document["weights"]:
            entry_id = db.execute(
                "INSERT INTO weight_entries (name, size_bytes, grad_size_bytes) VALUES (?, ?, ?)",
                (weight["name"], weight["size_bytes"], weight["grad_size_bytes"]),
            ).lastrowid
            _correlate(db, entry_id, WEIGHT_ENTRY, weight["contexts"])
        for op in operation_leaves(document["operations"]):
            if op["activation_bytes"] <= 0:
                continue
            entry_id = db.execute(
                "INSERT INTO activation_entries (operation_name, size_bytes) VALUES (?, ?)",
                (op["name"], op["activation_bytes"]),
            ).lastrowid
            _correlate(db, entry_id, ACTIVATION_ENTRY, op["contexts"])
        db.execute(
            "INSERT INTO misc_sizes (key, size_bytes) VALUES ('peak_usage_bytes', ?)",
            (document["iteration"]["peak_memory_bytes"],),
        )

    _write_database(path, fill)


def operation_leaves(node: OperationNodeDict) -> Iterator[OperationNodeDict]:
    if node["kind"] == "operation":
        yield node
    for child in node["children"]:
        yield from operation_leaves(child)


def _correlate(db: sqlite3.Connection, entry_id: int | None, entry_type: int, contexts: list[FrameDict]) -> None:
    correlation_id = db.execute(
        "INSERT INTO stack_correlation (entry_id, entry_type) VALUES (?, ?)", (entry_id, entry_type)
    ).lastrowid
    db.executemany(
        "INSERT INTO stack_frames (correlation_id, ordering, file_path, line_number) VALUES (?, ?, ?, ?)",
        [(correlation_id, i, c["path"], c["line"]) for i, c in enumerate(contexts)],
    )


def _write_database(path: str | Path, fill: Callable[[sqlite3.Connection], None]) -> None:
    """Build the database beside `path` and rename it into place: whole or not at all."""

    def write(temporary: str) -> None:
        db = sqlite3.connect(temporary)
        try:
            with db:
                db.execute(f"PRAGMA user_version = {REPORT_FORMAT_VERSION:d}")
                fill(db)
        finally:
            db.close()

    write_atomic(path, write)
