"""The memory parts add up (issue "Numbers you can act on", item 6): gradients are counted while
they are alive, also when the iteration frees them at its end; the parts describe the moment of the
peak and sum to it. The real engine on iterations whose tensors are known by construction."""

from __future__ import annotations

from skyline_engine.analysis.session import AnalysisRequest, analyze
from skyline_engine.measure.timing import TimingBudget

QUICK = TimingBudget(min_run_s=0.05, max_run_s=0.3)

ZERO_GRAD_LAST = """\
import torch


def skyline_model_provider():
    return torch.nn.Sequential(torch.nn.Linear(16, 256), torch.nn.ReLU(), torch.nn.Linear(256, 64))


def skyline_input_provider(batch_size=8):
    return (torch.randn(batch_size, 16),)


def skyline_iteration_provider(model):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    def iteration(x):
        model(x).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)  # no .grad is left when the iteration ends

    return iteration
"""


def analysed(tmp_path, source: str) -> dict:
    """The document of the entry point `source`, on the CPU without predictions."""
    (tmp_path / "entry_point.py").write_text(source, encoding="utf-8")
    request = AnalysisRequest("entry_point.py", tmp_path, device="cpu", budget=QUICK, predict=False)
    return analyze(request).to_dict()


def test_gradients_freed_at_the_end_of_the_iteration_are_counted(tmp_path):
    # Each parameter's gradient lives through backward and the step, the size of the parameter.
    document = analysed(tmp_path, ZERO_GRAD_LAST)
    weights = {w["name"]: (w["size_bytes"], w["grad_size_bytes"]) for w in document["weights"]}
    assert weights == {
        "model.0.weight": (256 * 16 * 4, 256 * 16 * 4),
        "model.0.bias": (256 * 4, 256 * 4),
        "model.2.weight": (64 * 256 * 4, 64 * 256 * 4),
        "model.2.bias": (64 * 4, 64 * 4),
    }
