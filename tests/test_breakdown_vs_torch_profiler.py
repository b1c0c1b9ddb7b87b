"""The engine finds, on its own, the operations torch.profiler sees under each line's range.

tests/projects/annotated wraps each forward line in `record_function`; torch.profiler, run on
the same model in this process, lists the aten operations beneath each range. The engine's
operation tree must put exactly those at that line (of the operations the engine records: the
profiler also shows what they call inside, such as `aten::linear` and `aten::as_strided`).
Exact and free of timing; the agreement of the times is measured in bench/profiler_agreement.py.
"""

import pytest
from torch.profiler import ProfilerActivity, profile

from annotated_model import PROJECT, iteration_and_inputs, marker_lines
from engine_helpers import analysed
from skyline_engine.measure.timing import TimingBudget

pytestmark = pytest.mark.slow  # an analysis


def profiler_operations() -> dict[str, set[str]]:
    """{range: names of the aten operations beneath it} in one profiled iteration."""
    iteration, inputs = iteration_and_inputs()
    iteration(*inputs)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        iteration(*inputs)

    def beneath(event):
        for child in event.cpu_children:
            yield child.name.removeprefix("aten::")
            yield from beneath(child)

    return {e.name: set(beneath(e)) for e in prof.events() if e.name.startswith("LINE_")}


def engine_operations() -> tuple[dict[int, set[str]], set[str]]:
    """({line: names of the forward operations at it}, names of every operation recorded)."""
    document = analysed(PROJECT, budget=TimingBudget(min_run_s=0.01), predict=False)

    def leaves(node):
        if node["kind"] == "operation":
            yield node
        for child in node.get("children", []):
            yield from leaves(child)

    at_lines: dict[int, set[str]] = {}
    recorded: set[str] = set()
    for leaf in leaves(document["operations"]):
        recorded.add(leaf["name"])
        innermost = leaf["contexts"][0] if leaf["contexts"] else None
        if innermost and innermost["path"] == "entry_point.py" and leaf["forward_ms"] > 0:
            at_lines.setdefault(innermost["line"], set()).add(leaf["name"])
    return at_lines, recorded


def test_each_line_holds_the_operations_torch_profiler_sees_in_its_range():
    theirs = profiler_operations()
    ours, recorded = engine_operations()
    lines = marker_lines()
    assert set(theirs) == set(lines) == {"LINE_A", "LINE_B", "LINE_C"}
    for marker, number in lines.items():
        assert ours.get(number) == theirs[marker] & recorded, (marker, ours, theirs[marker])
    # What the comparison rests on, spelled out for the model's lines.
    assert ours[lines["LINE_A"]] == ours[lines["LINE_B"]] == {"t", "addmm", "relu"}
    assert ours[lines["LINE_C"]] == {"t", "addmm", "_log_softmax", "nll_loss_forward"}
