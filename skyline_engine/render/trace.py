"""A Chrome trace event file of the recorded iteration, which Perfetto and chrome://tracing open.

One span per operation, named by the operation and the user's line, on one track for each phase:
the forward pass, the backward pass, the optimizer's step.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from skyline_engine.analysis.document import DocumentDict
from skyline_engine.render.files import write_text_atomic

_TRACKS = {"forward": 1, "backward": 2, "optimizer": 3}
_TRACK_NAMES = {"forward": "forward", "backward": "backward", "optimizer": "optimizer step"}


def chrome_trace(document: DocumentDict) -> dict[str, Any]:
    events = [
        {"name": "process_name", "ph": "M", "pid": 1, "args": {"name": f"skyline: {document['entry_point']}"}},
    ]
    events += [
        {"name": "thread_name", "ph": "M", "pid": 1, "tid": _TRACKS[phase], "args": {"name": name}}
        for phase, name in _TRACK_NAMES.items()
    ]
    for op in document.get("timeline") or []:
        where = f"{op['path']}:{op['line']}" if op["path"] else "untracked"
        events.append(
            {
                "name": f"{op['name']} · {where}",
                "cat": op["phase"],
                "ph": "X",
                "pid": 1,
                "tid": _TRACKS[op["phase"]],
                "ts": op["start_ms"] * 1000.0,
                "dur": op["duration_ms"] * 1000.0,
                "args": {"module": op["module"], "path": op["path"], "line": op["line"]},
            }
        )
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def write_chrome_trace(path: str | Path, document: DocumentDict) -> None:
    write_text_atomic(path, json.dumps(chrome_trace(document)))
