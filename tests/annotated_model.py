"""tests/projects/annotated, the model whose forward lines are also `record_function` ranges,
outside the engine: its marked lines, and its iteration ready to run under torch.profiler. Shared
by tests/test_breakdown_vs_torch_profiler.py (which operations) and bench/profiler_agreement.py
(how long)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any, Callable

PROJECT = Path(__file__).resolve().parent / "projects" / "annotated"
ENTRY = PROJECT / "entry_point.py"


def marker_lines() -> dict[str, int]:
    """{"LINE_A": its line number, ...}: each forward line ends with a `# LINE_x` comment."""
    return {
        text.split("# ")[-1].strip(): number
        for number, text in enumerate(ENTRY.read_text().splitlines(), 1)
        if "# LINE_" in text
    }


def iteration_and_inputs() -> tuple[Callable[..., Any], tuple[Any, ...]]:
    """The entry point's iteration over its model, and its inputs, as the user's code makes them."""
    spec = importlib.util.spec_from_file_location("annotated_entry", ENTRY)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    model = module.skyline_model_provider()
    return module.skyline_iteration_provider(model), module.skyline_input_provider()
