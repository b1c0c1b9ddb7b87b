"""Importing for a process that runs one analysis, then ends (the command line, the service's
workers): torch, its compiler and the engine are imported with the garbage collector off, then
frozen before it is turned on again (measure/memory.py, `freeze_imports`, which says what each
saves). Importable without torch: the imports it surrounds are the ones that bring torch in."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def imported_and_frozen(collect: bool) -> Iterator[None]:
    """What is imported inside, with the collector off; at the end, what the process holds goes
    into the collector's permanent generation (`freeze_imports(collect)`) before the collector is
    on again: turned on first, its next collection walks every object the imports made (0.13 s
    after torch's and its compiler's)."""
    gc.disable()
    try:
        yield
        from skyline_engine.measure.memory import freeze_imports

        freeze_imports(collect)
    finally:
        gc.enable()  # as the process started, before the user's code runs
