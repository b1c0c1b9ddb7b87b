"""The per-line and per-operation breakdown, on purpose-built models, with real torch."""

import shutil
from collections import Counter
from pathlib import Path

import pytest

from engine_helpers import STEADY, analysed, marked_line
from skyline_engine.attribute import recording

PROJECT = Path(__file__).parent / "projects" / "breakdown"


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("breakdown")
    shutil.copytree(PROJECT, root, dirs_exist_ok=True)
    return root


@pytest.fixture(scope="module")
def document(project) -> dict:
    # Several recorded iterations however slow the machine is now: how many fit in the recording's
    # time budget depends on the load (one, with two other test runs on the cores).
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(recording, "RECORDING_BUDGET_MS", 1e9)
        return analysed(project, budget=STEADY, predict=False)


def line(document, path, marker, project):
    number = marked_line(project / path, f"# {marker}")
    found = [entry for entry in document["lines"] if entry["path"] == path and entry["line"] == number]
    assert found, f"{path}:{number} ({marker}) is not in the breakdown"
    return found[0]


@pytest.mark.slow
@pytest.mark.parametrize(
    "path, marker",
    [
        ("model.py", "INPUT_CALL"),  # a module called from forward
        ("model.py", "LOOP"),  # a ModuleList loop, with an in-place relu_
        ("model.py", "CHECKPOINT"),  # activation checkpointing (recomputed in backward)
        ("model.py", "LOSS"),
        ("helpers.py", "HELPER"),  # a plain function in another project file
        ("helpers.py", "FUNCTION_FORWARD"),  # a custom autograd.Function
    ],
)
def test_each_line_has_forward_and_backward_time(document, project, path, marker):
    entry = line(document, path, marker, project)
    assert entry["forward_ms"] > 0
    assert entry["backward_ms"] > 0
    assert entry["invocations"] >= 1


def own_ms(entry):
    return entry["forward_ms"] + entry["backward_ms"] + entry["step_ms"]


@pytest.mark.slow
def test_each_backward_node_runs_at_the_forward_line_that_created_it(project):
    # Exact: the operation that defines each node's gradient, by name and count, at its line. The
    # backward of the loss belongs to the loss's line, not to `loss.backward()` (where the last
    # operation to see the loss's sequence number, the gradient seed, would put it), and the
    # entry point's backward line runs only the parameters' AccumulateGrad (a `detach` each).
    timeline = analysed(project, budget=STEADY, predict=False, timeline=True)["timeline"]
    backward = Counter((e["name"], e["path"], e["line"]) for e in timeline if e["phase"] == "backward")

    def at(path, marker):
        return path, marked_line(project / path, f"# {marker}")

    expected = {
        ("nll_loss_backward", *at("model.py", "LOSS")): 1,
        ("_log_softmax_backward_data", *at("model.py", "LOSS")): 1,
        ("threshold_backward", *at("model.py", "LOOP")): 3,  # relu_, once per layer
        ("gelu_backward", *at("model.py", "CHECKPOINT")): 1,
        ("tanh_backward", *at("helpers.py", "HELPER")): 1,
        ("sigmoid_backward", *at("helpers.py", "RECURSION")): 3,  # repeated_sigmoid(h, 3)
    }
    assert {key: backward[key] for key in expected} == expected
    entry_point = {name for name, path, _ in backward if path == "entry_point.py"}
    assert entry_point == {"detach"}
    # One AccumulateGrad per parameter: inp, 3 layers, the block's Linear and out, weight and bias each.
    assert backward[("detach", *at("entry_point.py", "BACKWARD_CALL"))] == 12


@pytest.mark.slow
def test_optimizer_step_is_the_step_of_its_line_not_forward(document, project):
    entry = line(document, "entry_point.py", "STEP", project)
    assert entry["step_ms"] > 0
    assert entry["forward_ms"] == 0 and entry["backward_ms"] == 0
    assert entry["inclusive"] == {"forward_ms": 0.0, "backward_ms": 0.0, "step_ms": entry["step_ms"]}
    assert entry["invocations"] == 1
    # No other line ran inside the step.
    assert sum(e["step_ms"] for e in document["lines"]) == entry["step_ms"]
    # The step updates the parameters in place and returns them: no activations of its own, even
    # when the next recorded iteration saves those parameters for backward.
    # The case that matters (more again where the machine was busy while timing).
    assert document["attribution"]["recorded_iterations"] >= recording.MAX_RECORDED_ITERATIONS
    assert entry["memory_bytes"] == 0

    # In the operation tree too, the step's operations are the update's time, not forward time.
    at_step = [
        n
        for n in leaves(document["operations"])
        if n["contexts"][:1] == [{"path": "entry_point.py", "line": entry["line"]}]
    ]
    assert at_step and all(n["forward_ms"] == 0 and n["backward_ms"] == 0 for n in at_step)
    assert sum(n["step_ms"] for n in at_step) == pytest.approx(entry["step_ms"])
    assert document["operations"]["step_ms"] == pytest.approx(entry["step_ms"])


@pytest.mark.slow
def test_times_are_never_negative_and_add_up_to_the_iteration(document):
    for entry in document["lines"]:
        assert entry["forward_ms"] >= 0 and entry["backward_ms"] >= 0 and entry["step_ms"] >= 0
        assert entry["memory_bytes"] >= 0
    untracked = document["untracked"]
    assert untracked["run_time_ms"] >= 0 and untracked["memory_bytes"] >= 0
    assert untracked["workspace_bytes"] == 0  # cuBLAS's workspaces: CUDA alone
    total = sum(own_ms(e) for e in document["lines"]) + untracked["run_time_ms"]
    # Exact: operations are scaled down when they exceed the iteration; untracked is the rest.
    assert total == pytest.approx(document["iteration"]["run_time_ms"], rel=1e-9)


@pytest.mark.slow
def test_lines_and_untracked_add_up_to_the_iteration_as_timed_last(project):
    """With predictions, the user's batch size is timed again beside the others after it was
    broken down (on a busy machine the two times differ by tens of percent): the lines still add
    up to the document's iteration, and no line holds more than all of it."""
    doc = analysed(project, budget=STEADY)
    run_time = doc["iteration"]["run_time_ms"]
    total = sum(own_ms(e) for e in doc["lines"]) + doc["untracked"]["run_time_ms"]
    assert total == pytest.approx(run_time, rel=1e-9)
    for entry in doc["lines"]:
        assert sum(entry["inclusive"].values()) <= run_time * (1 + 1e-9)
    assert doc["attribution"]["user_lines_fraction"] <= 1 + 1e-9


@pytest.mark.slow
def test_a_callers_inclusive_time_is_the_own_time_of_the_lines_beneath_it(document, project):
    # `h = scaled_tanh(h)` runs nothing itself; everything beneath it runs at the helper's line.
    caller = line(document, "model.py", "HELPER_CALL", project)
    helper = line(document, "helpers.py", "HELPER", project)
    assert (caller["forward_ms"], caller["backward_ms"], caller["step_ms"]) == (0, 0, 0)
    assert caller["invocations"] == 1
    for phase in ("forward_ms", "backward_ms", "step_ms"):
        assert caller["inclusive"][phase] == pytest.approx(helper[phase], rel=1e-9, abs=1e-12)
        assert helper["inclusive"][phase] == pytest.approx(helper[phase], rel=1e-9, abs=1e-12)


@pytest.mark.slow
def test_the_entry_points_model_call_holds_the_models_lines(document, project):
    call = line(document, "entry_point.py", "MODEL_CALL", project)
    assert (call["forward_ms"], call["backward_ms"], call["step_ms"]) == (0, 0, 0)
    assert call["invocations"] == 1  # one call of the model
    beneath = [e for e in document["lines"] if e["path"] in ("model.py", "helpers.py")]
    for phase in ("forward_ms", "backward_ms"):
        assert call["inclusive"][phase] == pytest.approx(sum(e[phase] for e in beneath), rel=1e-9)
    assert call["inclusive"]["step_ms"] == 0
    # All other forward and backward work of the entry point is at `loss.backward()`: the seed
    # gradient (`ones_like`) and the accumulation of the weights' gradients.
    outside = {
        e["line"] for e in document["lines"] if e["path"] == "entry_point.py" and e["forward_ms"] + e["backward_ms"]
    }
    assert outside == {marked_line(project / "entry_point.py", "# BACKWARD_CALL")}


@pytest.mark.slow
def test_recursion_counts_each_operation_once_per_line(document, project):
    recursion = line(document, "helpers.py", "RECURSION", project)
    caller = line(document, "model.py", "RECURSION_CALL", project)
    assert recursion["forward_ms"] > 0 and recursion["backward_ms"] > 0
    assert recursion["invocations"] == 3  # three nested calls ran operations, per iteration
    for phase in ("forward_ms", "backward_ms"):
        # Its operations ran one, two and three frames deep in the line: each counts once.
        assert recursion["inclusive"][phase] == pytest.approx(recursion[phase], rel=1e-9)
        assert caller["inclusive"][phase] == pytest.approx(recursion[phase], rel=1e-9)


@pytest.mark.slow
def test_every_lines_inclusive_time_is_that_of_the_operations_beneath_it(document):
    """The operation tree's leaves carry each operation's whole stack: the inclusive time of a line
    is the time of the leaves whose stack passes through it."""
    beneath: dict[tuple[str, int], float] = {}
    for leaf in leaves(document["operations"]):
        for where in {(c["path"], c["line"]) for c in leaf["contexts"]}:
            beneath[where] = beneath.get(where, 0.0) + leaf["forward_ms"] + leaf["backward_ms"] + leaf["step_ms"]
    for entry in document["lines"]:
        inclusive = sum(entry["inclusive"].values())
        assert inclusive == pytest.approx(beneath.get((entry["path"], entry["line"]), 0.0), rel=1e-9, abs=1e-12)
        assert inclusive >= own_ms(entry) * (1 - 1e-9)


@pytest.mark.slow
def test_lines_are_ordered_by_path_then_line(document):
    places = [(e["path"], e["line"]) for e in document["lines"]]
    assert places == sorted(set(places))


@pytest.mark.slow
def test_weights_memory_is_the_parameters_bytes_at_the_line_that_created_them(document, project):
    weights = {w["name"]: w for w in document["weights"]}
    inp = weights["model.inp.weight"]
    assert inp["size_bytes"] == 32 * 128 * 4
    assert inp["grad_size_bytes"] == 32 * 128 * 4
    assert (inp["contexts"][0]["path"], inp["contexts"][0]["line"]) == (
        "model.py",
        marked_line(project / "model.py", "# INPUT_LAYER"),
    )
    layer = weights["model.layers.2.weight"]
    assert layer["size_bytes"] == 128 * 128 * 4
    assert layer["contexts"][0]["line"] == marked_line(project / "model.py", "# LAYERS")
    # The line that created the module carries its weights and gradients in its memory.
    assert line(document, "model.py", "INPUT_LAYER", project)["memory_bytes"] == 2 * (32 * 128 + 128) * 4


@pytest.mark.slow
def test_optimizer_state_belongs_to_the_optimizers_construction_line(document, project):
    (state,) = document["optimizer_state"]
    parameters = sum(w["size_bytes"] for w in document["weights"])
    assert state["name"] == "SGD"
    assert state["size_bytes"] == parameters  # one momentum buffer per parameter
    assert state["contexts"][0] == {
        "path": "entry_point.py",
        "line": marked_line(project / "entry_point.py", "# OPTIMIZER"),
    }


@pytest.mark.slow
def test_activations_kept_for_backward_are_attributed_to_their_operations(document, project):
    batch, width = 64, 128
    loop = line(document, "model.py", "LOOP", project)
    # relu_ keeps its output for backward: one batch x width float tensor per layer.
    assert loop["memory_bytes"] >= 3 * batch * width * 4


@pytest.mark.slow
def test_module_tree_groups_operations_by_module_in_execution_order(document):
    root = document["operations"]
    (model,) = [c for c in root["children"] if c["module"] == "model"]
    names = [c["module"] for c in model["children"] if c["kind"] == "module"]
    assert names[:3] == ["model.inp", "model.layers", "model.block"]
    layers = next(c for c in model["children"] if c["module"] == "model.layers")
    assert [c["module"] for c in layers["children"]] == ["model.layers.0", "model.layers.1", "model.layers.2"]
    for node in layers["children"]:
        assert node["forward_ms"] > 0 and node["backward_ms"] > 0
        assert node["forward_ms"] == pytest.approx(sum(c["forward_ms"] for c in node["children"]))
    assert model["forward_ms"] == pytest.approx(sum(c["forward_ms"] for c in model["children"]))


def leaves(node):
    if node["kind"] == "operation":
        yield node
    for child in node["children"]:
        yield from leaves(child)


@pytest.mark.slow
def test_no_operation_is_counted_twice(document):
    tree_ms = sum(n["forward_ms"] + n["backward_ms"] + n["step_ms"] for n in leaves(document["operations"]))
    assert tree_ms == pytest.approx(document["attribution"]["operations_ms"], rel=1e-6)
    lines_ms = sum(own_ms(e) for e in document["lines"])
    assert lines_ms == pytest.approx(document["attribution"]["user_lines_ms"], rel=1e-6)


@pytest.mark.slow
def test_an_optimizer_constructed_in_another_project_file_belongs_to_that_line(tmp_path):
    (tmp_path / "training.py").write_text(
        "import torch\n\n\ndef make_optimizer(model):\n    return torch.optim.Adam(model.parameters())  # OPTIMIZER\n"
    )
    (tmp_path / "entry_point.py").write_text(
        "import torch\nfrom training import make_optimizer\n\n\n"
        "def skyline_model_provider():\n    return torch.nn.Linear(8, 1)\n\n\n"
        "def skyline_input_provider(batch_size=4):\n    return (torch.randn(batch_size, 8),)\n\n\n"
        "def skyline_iteration_provider(model):\n"
        "    optimizer = make_optimizer(model)\n\n"
        "    def iteration(x):\n        optimizer.zero_grad()\n"
        "        model(x).sum().backward()\n        optimizer.step()\n\n"
        "    return iteration\n"
    )
    document = analysed(tmp_path, budget=STEADY, predict=False)
    (state,) = document["optimizer_state"]
    assert state["name"] == "Adam"
    assert state["contexts"][0] == {"path": "training.py", "line": marked_line(tmp_path / "training.py", "# OPTIMIZER")}


@pytest.mark.slow
def test_a_parameter_saved_through_a_view_is_no_activation(tmp_path, monkeypatch):
    """Each Linear saves `t(weight)`, a view of its weight, for the input's gradient: the weight is
    no activation of `t` (it was a third of it, over three recorded iterations). The line's memory
    is the ReLU's output alone, which the second Linear saves too."""
    # As many recorded iterations as the breakdown combines, whatever the machine's load (the count
    # follows the iteration's time: 4, not 5, beside a CI run).
    monkeypatch.setattr(recording, "RECORDING_BUDGET_MS", 1e9)
    batch_size, hidden = 32, 64
    (tmp_path / "entry_point.py").write_text(
        "import torch\nimport torch.nn as nn\n\n\n"
        "def skyline_model_provider():\n"
        f"    return nn.Sequential(nn.Linear(8, {hidden}), nn.ReLU(), nn.Linear({hidden}, 4))\n\n\n"
        f"def skyline_input_provider(batch_size={batch_size}):\n    return (torch.randn(batch_size, 8),)\n\n\n"
        "def skyline_iteration_provider(model):\n"
        "    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)\n\n"
        "    def iteration(x):\n"
        "        optimizer.zero_grad()\n"
        "        model(x).pow(2).mean().backward()  # MODEL\n"
        "        optimizer.step()\n\n"
        "    return iteration\n"
    )
    doc = analysed(tmp_path, budget=STEADY, predict=False)
    assert doc["attribution"]["recorded_iterations"] >= recording.MAX_RECORDED_ITERATIONS  # where it showed
    model_line = line(doc, "entry_point.py", "MODEL", tmp_path)
    relu_output, squared_output = batch_size * hidden * 4, batch_size * 4 * 4  # pow saves its input
    assert model_line["memory_bytes"] == relu_output + squared_output
    assert doc["operations"]["activation_bytes"] == relu_output + squared_output


@pytest.mark.slow
def test_activations_are_counted_once_per_tensor_at_the_line_that_made_it():
    """tests/projects/activations: exp's output (batch × 256 float32) is saved by exp and twice by
    the product that squares it; the product's own output is saved by nothing (a sum needs only
    its shape), nor are the input and the parameter made by a line of the iteration."""
    project = Path(__file__).parent / "projects" / "activations"
    batch_size = 64
    doc = analysed(project, budget=STEADY, predict=False)
    memory = {e["line"]: e["memory_bytes"] for e in doc["lines"] if e["path"] == "entry_point.py"}
    model = project / "entry_point.py"
    assert memory[marked_line(model, "# EXP")] == batch_size * 256 * 4
    assert memory[marked_line(model, "# SQUARE")] == 0
    assert doc["operations"]["activation_bytes"] == batch_size * 256 * 4


def test_cublas_workspaces_stay_in_the_untracked_memory_of_a_breakdown_fitted_to_the_iteration():
    from skyline_engine.attribute.breakdown import Attribution, Breakdown, OperationNode, Untracked

    recorded = OperationNode("iteration", "", "module", forward_ms=1.0, backward_ms=1.0)
    breakdown = Breakdown([], recorded, [], [], Untracked(0.5, 4096), Attribution(1, 2.0, 2.0, 0.8, 1.0))
    fitted = breakdown.with_workspaces(1024).fitted_to(1.5)  # the document fits it to the iteration
    assert fitted.untracked.to_dict() == {"run_time_ms": 0.0, "memory_bytes": 4096, "workspace_bytes": 1024}
    # Never more of it than the untracked memory holds (the activations are counted as all alive).
    assert breakdown.with_workspaces(10_000).untracked.workspace_bytes == 4096
