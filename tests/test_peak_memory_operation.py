"""Where the memory peaked: the operation after which the recorded iteration held the most bytes,
at its line. A frozen backbone run without gradients keeps none of its activations, so its peak
was "untracked" memory at no line (4.3 MiB of a 4.4 MiB peak); now the report names the line.
The real engine on purpose-built iterations whose peak is known by construction."""

from __future__ import annotations

import pytest

from engine_helpers import analysed, marked_line

pytestmark = pytest.mark.slow  # an analysis each

HEAD = """\
import torch
import torch.nn as nn


def skyline_input_provider(batch_size=8):
    return (torch.randn(batch_size, 16),)
"""

CASES = {
    # A tensor 1,024 times the input's, made and dropped without gradients: the peak, in forward
    # (a name for it would keep it alive to the end of the iteration).
    "a transient under no_grad": (
        """
def skyline_model_provider():
    return nn.Linear(16, 16)


def skyline_iteration_provider(model):
    def iteration(x):
        with torch.no_grad():
            x = x + x.repeat(1, 1024).sum() * 0  # PEAK
        model(x).pow(2).mean().backward()

    return iteration
""",
        "forward",
    ),
    # Single-tensor Adam's step makes two weight-sized temporaries on top of weights, gradients
    # and its state, where backward makes one (the wide layer's weight gradient, before it is
    # added to .grad) and its activations are a thousandth of them.
    "an optimizer's step": (
        """
def skyline_model_provider():
    return nn.Sequential(nn.Linear(16, 256), nn.Linear(256, 4096))


def skyline_iteration_provider(model):
    optimizer = torch.optim.Adam(model.parameters(), foreach=False)

    def iteration(x):
        optimizer.zero_grad(set_to_none=False)
        model(x).pow(2).mean().backward()
        optimizer.step()  # PEAK

    return iteration
""",
        "optimizer",
    ),
}


@pytest.mark.parametrize("case", CASES)
def test_the_peak_is_named_at_the_line_that_reached_it(tmp_path, case):
    iteration, phase = CASES[case]
    source = HEAD + iteration
    document = analysed(tmp_path, source=source, predict=False)
    peak = document["peak_memory_operation"]
    assert (peak["path"], peak["line"], peak["phase"]) == ("entry_point.py", marked_line(source, "# PEAK"), phase)
    assert peak["operation"]
