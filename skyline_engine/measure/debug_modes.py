"""Debugging aids left on that slow every operation: autograd's anomaly detection.

`torch.autograd.set_detect_anomaly(True)`, or `with torch.autograd.detect_anomaly():` around the
forward pass, makes autograd keep a Python stack trace for every operation of the forward pass and
check every gradient of the backward pass for NaN: an MLP's iteration took 25.2 ms with it for
12.8 ms without, side by side in one process. It is left on from chasing a NaN more often than
not, and everything measured under it describes the debugging, not the training: the runner
notices it from inside the iteration (measure/iteration.py) and the user is told where it is.
"""

from __future__ import annotations

import re
from pathlib import Path

from skyline_engine.entry.user_frames import ProjectFiles

# `set_detect_anomaly(` or `detect_anomaly(` in code, not in a comment, not turning it off.
_SWITCH = re.compile(r"^[^#]*\b(?:set_)?detect_anomaly\s*\((?!\s*False)")


def anomaly_detection_note(files: ProjectFiles, entry_point: str) -> str:
    """What to tell the user whose iteration ran with anomaly detection on, naming the lines of
    their code that turn it on."""
    lines = _switched_on_at(files, entry_point)
    where = f" ({', '.join(lines)})" if lines else ""
    return (
        f"Autograd's anomaly detection was on while your iteration ran{where}: it keeps a stack trace for "
        "every operation and checks every gradient for NaN, which makes training slower (an MLP took twice "
        "as long), so the times measured are those of debugging. Turn it off "
        "(torch.autograd.set_detect_anomaly(False)) and profile again."
    )


def _switched_on_at(files: ProjectFiles, entry_point: str) -> list[str]:
    """`path:line` of each call that mentions detect_anomaly in the entry point (`entry_point`,
    relative to the project root) and the project's modules it imported."""
    found = []
    for path in sorted({entry_point, *(path for path in files.loaded() if path.endswith(".py"))}):
        try:
            text = (Path(files.root) / path).read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        found += [f"{path}:{number}" for number, line in enumerate(text.splitlines(), start=1) if _SWITCH.match(line)]
    return found
