"""The breakdown stays consistent on iterations that are unusual (issue: breakdown's bad input)."""

import textwrap

import pytest

from engine_helpers import analysed, marked_line

pytestmark = pytest.mark.slow  # an analysis each

MODEL = """
import threading

import torch
import torch.nn as nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(64, 64)

    def forward(self, x):
        return self.fc(x)  # FORWARD


def skyline_model_provider():
    return Net()


def skyline_input_provider(batch_size=32):
    return (torch.randn(batch_size, 64),)
"""

ITERATIONS = {
    "no_backward": """
def skyline_iteration_provider(model):
    def iteration(x):
        with torch.no_grad():
            model(x)  # CALL
    return iteration
""",
    "backward_twice": """
def skyline_iteration_provider(model):
    def iteration(x):
        loss = model(x).square().mean()  # CALL
        loss.backward(retain_graph=True)
        loss.backward()
        model.zero_grad()
    return iteration
""",
    "tuple_output": """
class Pair(nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        y = self.inner(x)
        return y.mean(), y.std()  # CALL


def skyline_iteration_provider(model):
    pair = Pair(model)
    def iteration(x):
        mean, std = pair(x)
        (mean + std).backward()
        model.zero_grad()
    return iteration
""",
    "outside_tensor": """
def skyline_iteration_provider(model):
    scale = torch.full((64,), 0.5)
    def iteration(x):
        x = x * scale  # CALL
        model(x).sum().backward()
        model.zero_grad()
    return iteration
""",
    "lbfgs_closure": """
def skyline_iteration_provider(model):
    optimizer = torch.optim.LBFGS(model.parameters(), max_iter=2)
    def iteration(x):
        def closure():
            optimizer.zero_grad()
            loss = model(x).square().mean()  # CALL
            loss.backward()
            return loss
        optimizer.step(closure)  # STEP
    return iteration
""",
    "reentrant_checkpoint": """
def skyline_iteration_provider(model):
    def iteration(x):
        x = x.detach().requires_grad_()
        y = torch.utils.checkpoint.checkpoint(model, x, use_reentrant=True)
        y.square().mean().backward()  # CALL
        model.zero_grad()
    return iteration
""",
    "gradient_penalty": """
def skyline_iteration_provider(model):
    def iteration(x):
        x = x.detach().requires_grad_()
        out = model(x)
        (grad,) = torch.autograd.grad(out.sum(), x, create_graph=True)  # CALL
        (out.square().mean() + grad.square().mean()).backward()
        model.zero_grad()
    return iteration
""",
    "threads": """
def skyline_iteration_provider(model):
    def iteration(x):
        worker = threading.Thread(target=lambda: torch.mm(torch.randn(256, 256), torch.randn(256, 256)))
        worker.start()
        model(x).sum().backward()  # CALL
        worker.join()
        model.zero_grad()
    return iteration
""",
}


@pytest.mark.parametrize("case", sorted(ITERATIONS))
def test_breakdown_is_consistent(tmp_path, case):
    source = textwrap.dedent(MODEL) + textwrap.dedent(ITERATIONS[case])
    doc = analysed(tmp_path, "entry.py", source=source, predict=False)
    lines = {(e["path"], e["line"]): e for e in doc["lines"]}
    for entry in doc["lines"]:
        assert entry["forward_ms"] >= 0 and entry["backward_ms"] >= 0
    assert doc["untracked"]["run_time_ms"] >= 0
    total = (
        sum(e["forward_ms"] + e["backward_ms"] + e["step_ms"] for e in doc["lines"]) + doc["untracked"]["run_time_ms"]
    )
    # Exact: operations are scaled down when they exceed the iteration; untracked is the rest.
    assert total == pytest.approx(doc["iteration"]["run_time_ms"], rel=1e-9)
    forward = lines[("entry.py", marked_line(source, "# FORWARD"))]
    assert forward["forward_ms"] > 0
    if case == "no_backward":
        assert all(e["backward_ms"] == 0 for e in doc["lines"])
        return
    assert forward["backward_ms"] > 0
    call = lines[("entry.py", marked_line(source, "# CALL"))]
    assert call["forward_ms"] > 0
    if case == "outside_tensor":
        assert call["backward_ms"] == 0  # `scale` and `x` need no gradient
    if case == "lbfgs_closure":
        # The step's own updates are its step time; the closure it calls runs the model forward,
        # with gradients: forward work, whose backward still finds the lines that created it.
        step = lines[("entry.py", marked_line(source, "# STEP"))]
        assert step["step_ms"] > 0 and step["forward_ms"] == 0
        assert step["inclusive"]["forward_ms"] >= (call["forward_ms"] + forward["forward_ms"]) * (1 - 1e-9)
        assert step["inclusive"]["backward_ms"] >= forward["backward_ms"] * (1 - 1e-9) > 0
    if case in ("reentrant_checkpoint", "gradient_penalty"):
        # Backward that builds a graph of its own (the checkpoint's forward run again; the gradient
        # taken with create_graph=True): the backward of that graph runs the forward line's nodes.
        # It was work of no line's, at the backward() call, as leaves named after their nodes.
        fallback = [c["name"] for c in doc["operations"]["children"] if c["name"].endswith(("Backward0", "Backward1"))]
        assert fallback == []
    if case == "backward_twice":
        # Both backward passes ran; their work lands on the lines that created the nodes.
        assert call["backward_ms"] > 0


BLOCKS = """
import torch
import torch.nn as nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(nn.Linear(16, 16) for _ in range(3))

    def forward(self, x):
        for block in self.blocks:
            x = block(x)  # BLOCK
        return x.pow(2).mean()


def skyline_model_provider():
    return Net()


def skyline_input_provider(batch_size=8):
    return (torch.randn(batch_size, 16),)


def skyline_iteration_provider(model):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    def iteration(x):
        model(x).backward()
        optimizer.step()

    return iteration
"""


def test_a_module_list_never_called_itself_stands_where_its_blocks_are_called(tmp_path):
    # Its row in the float jumps to a line: the one that calls its blocks, not nowhere.
    doc = analysed(tmp_path, "entry.py", source=BLOCKS, predict=False)
    (model,) = [c for c in doc["operations"]["children"] if c["name"] == "model"]
    (blocks,) = [c for c in model["children"] if c["module"] == "model.blocks"]
    line = {"path": "entry.py", "line": marked_line(BLOCKS, "# BLOCK")}
    assert blocks["contexts"] == [line]
    assert all(child["contexts"] == [line] for child in blocks["children"])
