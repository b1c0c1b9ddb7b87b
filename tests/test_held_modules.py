"""The modules an iteration holds beside the model (measure/held_modules.py), found where user
code keeps them: a closure, a trainer whose method is the iteration, a partial, a list or a dict
of them; the model and its parts are never among them. Then, through the real engine, the lines
their weights stand at."""

from __future__ import annotations

import copy
import functools

import pytest
import torch

from engine_helpers import analysed, marked_line
from skyline_engine.measure.held_modules import modules_held_by


def mlp() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))


def test_a_closure_holds_an_ema_copy_but_not_the_model_or_its_parts():
    model = mlp()
    ema = copy.deepcopy(model)
    head = model[2]

    def iteration(x):
        model(x)
        head(x)
        ema(x)

    assert modules_held_by(iteration, model) == {"ema": ema}


def test_a_trainer_method_holds_its_attributes_and_their_lists_and_dicts():
    model = mlp()

    class Trainer:
        def __init__(self):
            self.model = model
            self.optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            self.averaged = torch.optim.swa_utils.AveragedModel(model)
            self.critics = [mlp(), mlp()]
            self.teachers = {"large": mlp()}

        def step(self, x):
            pass

    trainer = Trainer()
    assert modules_held_by(trainer.step, model) == {
        "averaged": trainer.averaged,
        "critics[0]": trainer.critics[0],
        "critics[1]": trainer.critics[1],
        "teachers['large']": trainer.teachers["large"],
    }


def test_a_callable_object_holds_its_attributes():
    model = mlp()

    class Step:
        def __init__(self):
            self.ema = copy.deepcopy(model)

        def __call__(self, x):
            pass

    step = Step()
    assert modules_held_by(step, model) == {"ema": step.ema}


def test_a_partial_and_a_nested_function_hold_theirs():
    model = mlp()
    teacher = mlp()
    shadow = mlp()

    def update():
        shadow.zero_grad()

    def step(x, teacher):
        update()

    assert modules_held_by(functools.partial(step, teacher=teacher), model) == {"shadow": shadow, "teacher": teacher}


def test_an_iteration_that_holds_nothing_else_holds_no_module():
    model = mlp()
    optimizer = torch.optim.Adam(model.parameters())

    def iteration(x):
        model(x).sum().backward()
        optimizer.step()

    assert modules_held_by(iteration, model) == {}


def test_a_long_list_is_looked_into_as_far_as_modules_come():
    model = mlp()
    critics = [mlp(), mlp()]
    samples = [torch.zeros(1) for _ in range(100_000)] + [mlp()]  # a module past the first items

    def iteration(x):
        return critics, samples

    assert modules_held_by(iteration, model) == {"critics[0]": critics[0], "critics[1]": critics[1]}


# The real engine: where held copies' weights stand (attribute/creation.py, held_stack).
PARTIAL = """\
import copy
import functools

import torch

args = dict(lr=0.1)


def skyline_model_provider():
    return torch.nn.Linear(4, 2)


def skyline_input_provider(batch_size=8):
    return (torch.randn(batch_size, 4),)


def skyline_iteration_provider(model):
    shadow = copy.deepcopy(model)  # SHADOW
    frozen = copy.deepcopy(model)

    def step(frozen, x):
        model(x).sum().backward()
        with torch.no_grad():
            for s, p in zip(shadow.parameters(), model.parameters()):
                s.mul_(0.9).add_(p, alpha=0.1)
            frozen(x)

    return functools.partial(step, frozen)
"""


@pytest.mark.slow
def test_a_bare_copys_weights_stand_where_it_is_assigned_a_partials_argument_nowhere(tmp_path):
    # `shadow` is assigned once, from a call: its weights stand there. The copy passed to the
    # partial is held as `args[0]`, a name no assignment makes: not at `args = dict(...)`.
    weights = {w["name"]: w["contexts"] for w in analysed(tmp_path, source=PARTIAL, predict=False)["weights"]}
    shadow = [{"path": "entry_point.py", "line": marked_line(PARTIAL, "# SHADOW")}]
    assert weights["shadow.weight"] == weights["shadow.bias"] == shadow
    assert weights["args[0].weight"] == weights["args[0].bias"] == []
