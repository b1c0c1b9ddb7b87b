"""Where the time no operation took went: inside optimizer steps (the optimizer's own Python, as
LBFGS's line search is) or in the user's code. The real engine on an iteration that sleeps, by
construction far longer than anything else it does, either inside a step or outside it, or
whose step runs long operations (40 products of 384 × 384 matrices) while it sleeps outside."""

from __future__ import annotations

import pytest

from engine_helpers import analysed

pytestmark = pytest.mark.slow  # an analysis each

ENTRY = """\
import time

import torch


BIG = torch.ones(384, 384)


class Pondering(torch.optim.SGD):
    # Python work inside the step, no operation: a line search's bookkeeping, drawn out; or
    # operations inside it, which are no time between operations.
    def step(self, closure=None):
        time.sleep({in_step})
        for _ in range({work}):
            torch.mm(BIG, BIG)
        return super().step(closure)


def skyline_model_provider():
    return torch.nn.Linear(4, 2)


def skyline_input_provider(batch_size=8):
    return (torch.randn(batch_size, 4),)


def skyline_iteration_provider(model):
    optimizer = Pondering(model.parameters(), lr=0.1)

    def iteration(x):
        time.sleep({outside})  # the user's own Python, outside any step
        optimizer.zero_grad()
        model(x).pow(2).mean().backward()
        optimizer.step()  # STEP

    return iteration
"""


@pytest.mark.parametrize(
    ("in_step", "work", "outside", "inside"),
    [
        (0.02, 0, 0.0, True),
        (0.0, 0, 0.02, False),
        (0.0, 40, 0.005, False),  # a step of long operations: their time is theirs, not between them
    ],
)
def test_the_time_between_operations_is_told_inside_steps_or_outside(tmp_path, in_step, work, outside, inside):
    entry = ENTRY.format(in_step=in_step, work=work, outside=outside)
    document = analysed(tmp_path, source=entry, predict=False)
    fraction = document["attribution"]["untracked_in_steps_fraction"]
    assert (fraction >= 0.5) is inside, fraction
    if work:
        return  # the products are the step line's time: most of the iteration is on the user's lines
    note = next(w for w in document["warnings"] if w.startswith("Only "))  # 20 ms of Python: little on lines
    assert ("inside optimizer steps (entry_point.py:" in note) is inside
    assert ("move data preparation into the input provider" in note) is not inside
