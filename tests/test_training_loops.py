"""Training loops as people write them today: mixed precision with a GradScaler that skips its
first steps, gradient accumulation with a fused optimizer and a scheduler, several optimizers and
parameter groups. Each figure is checked against a count made here from the model's definition.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import torch

from engine_helpers import SERVE_QUICK, analysed, marked_line
from skyline_engine.entry.loader import load_entry_point
from skyline_engine.measure.iteration import IterationRunner
from skyline_engine.render.terminal import render_report

pytestmark = pytest.mark.slow  # an analysis each

PROJECT = Path(__file__).parent / "projects" / "training_loops"
FLOAT32 = 4
# tests/projects/training_loops/model.py: Linear(64, 256), Linear(256, 256), Linear(256, 10).
BODY = (64 * 256 + 256) + (256 * 256 + 256)
HEAD = 256 * 10 + 10
ADAM_STEPS = FLOAT32  # each parameter's `step`, a float32 scalar on the CPU


def analysed_loop(entry: str, predict: bool = True) -> dict:
    """The document of PROJECT's `entry`, at the budget of `skyline serve --quick`."""
    return analysed(PROJECT, entry, budget=SERVE_QUICK, predict=predict)


def line(doc: dict, path: str, number: int) -> dict:
    return next(e for e in doc["lines"] if (e["path"], e["line"]) == (path, number))


def marked(path: str, marker: str) -> int:
    """The line of PROJECT/`path` that ends with `# MARKER`."""
    return marked_line(PROJECT / path, f"# {marker}")


@pytest.fixture(scope="module")
def accumulation():
    return analysed_loop("accumulation.py")


def test_a_scaler_that_skips_its_first_steps_is_measured_in_steady_state():
    # The scaler skips optimizer.step() for about 20 iterations: measured after one warm-up, Adam
    # had no state yet, and the peak was 789,348 bytes instead of 1,893,832.
    doc = analysed_loop("mixed_precision.py", predict=False)
    state = doc["optimizer_state"]
    assert [(s["name"], s["size_bytes"]) for s in state] == [("Adam", 2 * FLOAT32 * (BODY + HEAD) + 6 * ADAM_STEPS)]
    assert (state[0]["contexts"][0]["path"], state[0]["contexts"][0]["line"]) == ("mixed_precision.py", 19)
    weights_and_grads = 2 * FLOAT32 * (BODY + HEAD)
    assert doc["iteration"]["peak_memory_bytes"] >= weights_and_grads + state[0]["size_bytes"]
    assert not any(w.startswith("No optimizer stepped") for w in doc["warnings"])
    step = line(doc, "mixed_precision.py", 27)  # scaler.step(optimizer): unscaling and checking included
    assert step["step_ms"] > 0 and step["forward_ms"] == 0 and step["backward_ms"] == 0


def test_a_loop_that_never_steps_says_so():
    doc = analysed_loop("never_steps.py", predict=False)
    assert doc["optimizer_state"] == []
    notes = [w for w in doc["warnings"] if w.startswith("No optimizer stepped")]
    assert notes == [
        "No optimizer stepped in 64 warm-up iterations. If your iteration steps one, through a GradScaler say "
        "(it skips optimizer.step() while the scaled gradients overflow), it did not reach a steady state: the "
        "optimizer's step and its state are missing from the time and memory measured. Start the scaler lower "
        "(init_scale), or run enough iterations in the iteration provider before returning the iteration."
    ]


def test_an_iteration_without_a_backward_pass_is_not_waited_for_an_optimizer():
    # Before: 64 more warm-up iterations, and a warning about a GradScaler to an inference loop.
    doc = analysed_loop("inference.py", predict=False)
    assert doc["optimizer_state"] == []
    assert not any(w.startswith("No optimizer stepped") for w in doc["warnings"])
    assert doc["iteration"]["run_time_ms"] > 0
    assert all(e["backward_ms"] == 0 and e["step_ms"] == 0 for e in doc["lines"])
    # The report names its peak's phase as what ran: a forward pass, no backward one.
    memory = next(line for line in render_report(doc).splitlines() if line.startswith("Memory"))
    assert "reached in the forward pass" in memory and "backward" not in memory, memory


def test_parameters_updated_by_hand_are_not_waited_for_an_optimizer():
    # Before: 64 more warm-up iterations, and a warning about a GradScaler to a loop that has no optimizer.
    doc = analysed_loop("manual_update.py", predict=False)
    assert doc["optimizer_state"] == []
    assert not any(w.startswith("No optimizer stepped") for w in doc["warnings"])
    update = line(doc, "manual_update.py", 22)  # p -= 0.01 * p.grad: the update's time, at its line
    assert update["step_ms"] > 0 and update["forward_ms"] == 0  # was forward time
    assert line(doc, "model.py", 12)["step_ms"] == 0  # the next forward pass reads what it wrote


def test_the_update_around_the_step_is_step_time_and_an_evaluation_after_it_forward_time():
    doc = analysed_loop("clipped.py", predict=False)
    # clip_grad_norm_: the gradients' norms, their norm, the coefficient (computed from the
    # gradients: forward work before), the gradients scaled; then zero_grad's in-place zeroing.
    for number in (23, 25):
        update = line(doc, "clipped.py", number)
        assert update["step_ms"] > 0 and update["forward_ms"] == 0 and update["backward_ms"] == 0
    assert line(doc, "clipped.py", 24)["step_ms"] > 0  # optimizer.step()
    # The model, trained then evaluated under no_grad: its lines do forward and backward work only.
    assert line(doc, "clipped.py", 27)["inclusive"]["forward_ms"] > 0
    assert line(doc, "clipped.py", 27)["inclusive"]["step_ms"] == 0
    for number in (12, 13, 14):
        assert line(doc, "model.py", number)["forward_ms"] > 0 and line(doc, "model.py", number)["step_ms"] == 0


def test_averaged_copies_updated_after_the_step_are_step_time_their_weights_weights():
    # The copies' updates read as forward time ("fwd 0.15 ms" on `ema.update_parameters(model)`):
    # they write no parameter of the model, but those of modules the iteration holds.
    # AveragedModel's own bookkeeping (`n_averaged == 0`, its count) stays forward work.
    doc = analysed_loop("ema.py", predict=False)
    averaged = line(doc, "ema.py", marked("ema.py", "EMA_UPDATE"))["inclusive"]
    assert averaged["step_ms"] > 0 and averaged["backward_ms"] == 0
    by_hand = line(doc, "ema.py", marked("ema.py", "SHADOW_UPDATE"))
    assert by_hand["step_ms"] > 0 and by_hand["forward_ms"] == 0 and by_hand["backward_ms"] == 0
    evaluation = line(doc, "ema.py", marked("ema.py", "EMA_EVAL"))["inclusive"]
    assert evaluation["forward_ms"] > 0 and evaluation["step_ms"] == 0
    # The copies' weights are weights (they were untracked memory), AveragedModel's at its line.
    copies = {w["name"]: w for w in doc["weights"] if not w["name"].startswith("model.")}
    assert sum(w["size_bytes"] for w in copies.values()) == 2 * FLOAT32 * (BODY + HEAD)
    assert {name.split(".")[0] for name in copies} == {"ema", "shadow"}
    assert line(doc, "ema.py", marked("ema.py", "AVERAGED"))["memory_bytes"] == FLOAT32 * (BODY + HEAD)
    # A bare deep copy registers no parameter: its weights stood at no line; now at its assignment.
    assert line(doc, "ema.py", marked("ema.py", "SHADOW"))["memory_bytes"] == FLOAT32 * (BODY + HEAD)
    # The averaged model's evaluation runs its modules, under the name the trainer holds it by.
    assert any(child["module"] == "ema" for child in doc["operations"]["children"])


def test_a_functional_step_with_torch_func_runs_without_saved_tensor_hooks():
    # torch.func.grad refuses saved-tensor hooks: the analysis failed at its first recorded
    # iteration with "torch.func.{grad, vjp, jacrev, hessian} don't yet support saved tensor hooks".
    doc = analysed_loop("functional.py")
    assert doc["models"] is not None and doc["iteration"]["run_time_ms"] > 0
    assert any(w.startswith("torch.func's transforms (grad, vjp, jacrev) refuse") for w in doc["warnings"])
    # The model's lines carry the forward and backward passes grad() runs; the update, its line.
    body = line(doc, "model.py", 12)  # hidden = self.body(x)
    assert body["forward_ms"] > 0 and body["backward_ms"] > 0
    # p -= 0.01 * found[name]: writes the parameters' storage (detached), the update's time
    assert line(doc, "functional.py", 29)["step_ms"] > 0
    # The next analysis in this process runs with hooks again: activations count by line.
    manual = analysed_loop("manual_update.py", predict=False)
    assert not any("saved-tensor hooks" in w for w in manual["warnings"])
    assert line(manual, "model.py", 12)["memory_bytes"] > 0


def test_accumulated_micro_batches_count_in_the_throughput(accumulation):
    doc = accumulation
    it = doc["iteration"]
    assert it["micro_batches"] == 4
    assert it["samples_per_second"] == pytest.approx(4 * doc["batch_size"] / it["run_time_ms"] * 1000)
    for sample in doc["models"]["samples"]:
        assert sample["micro_batches"] == 4
        assert sample["samples_per_second"] == pytest.approx(4 * sample["batch_size"] / sample["run_time_ms"] * 1000)
    assert doc["models"]["micro_batches"] == 4
    line_ms = doc["models"]["run_time_ms"]
    if doc["models"]["asymptotic_samples_per_second"] is not None:
        assert doc["models"]["asymptotic_samples_per_second"] == pytest.approx(4 * 1000 / line_ms["slope"])
    for row in doc["predictions"]:
        if row["run_time_ms"] is not None:
            assert row["samples_per_second"] == pytest.approx(4 * row["batch_size"] / row["run_time_ms"] * 1000)
    speed = render_report(doc).split("\n\n")[1].splitlines()[0]
    rate = f"{it['samples_per_second']:,.0f}"
    assert speed.startswith(f"Speed        {rate} samples/s at batch size 32 × 4 micro-batches ")
    assert "(128 samples per optimizer step)" in speed


def test_a_fused_optimizer_and_its_scheduler_step_in_the_step_phase(accumulation):
    doc = accumulation
    state = doc["optimizer_state"]
    assert [(s["name"], s["size_bytes"]) for s in state] == [("Adam", 2 * FLOAT32 * (BODY + HEAD) + 6 * ADAM_STEPS)]
    assert state[0]["contexts"][0]["line"] == 20  # the constructor
    step = line(doc, "accumulation.py", 28)  # optimizer.step()
    assert step["step_ms"] > 0 and step["forward_ms"] == 0 and step["backward_ms"] == 0


def test_accumulation_to_a_fixed_number_of_samples_counts_each_batch_sizes_micro_batches():
    # 128 samples a step at every batch size: counted with the user's 8 micro-batches, batch size 8
    # (16 of them) read half its throughput and 32 (4 of them) twice its, and the run-time line fell.
    doc = analysed_loop("samples_per_step.py")
    models = doc["models"]
    assert {s["batch_size"]: s["micro_batches"] for s in models["samples"]} == {8: 16, 16: 8, 32: 4}
    for sample in models["samples"]:
        assert sample["samples_per_second"] == pytest.approx(128 / sample["run_time_ms"] * 1000)
    assert doc["iteration"]["micro_batches"] == 8
    assert (models["micro_batches"], models["samples_per_step"]) == (1, 128)
    # The line is one micro-batch's time: the measured iterations' divided by their micro-batches.
    line_at = {
        s["batch_size"]: models["run_time_ms"]["slope"] * s["batch_size"] + models["run_time_ms"]["bias"]
        for s in models["samples"]
    }
    worst = max(abs(line_at[s["batch_size"]] * s["micro_batches"] / s["run_time_ms"] - 1) for s in models["samples"])
    assert worst == pytest.approx(models["run_time_ms"]["max_relative_residual"])


def test_a_batch_split_into_chunks_is_one_batch_not_micro_batches():
    # Four chunks at batch size 64, one forward and backward each, one step: counted as four
    # micro-batches of 64 samples, the throughput was four times what it is, and the calls at
    # other batch sizes (two chunks, eight) were told they differ.
    doc = analysed_loop("chunks.py")
    it = doc["iteration"]
    assert it["micro_batches"] == 1 and doc["models"]["micro_batches"] == 1
    assert it["samples_per_second"] == pytest.approx(doc["batch_size"] / it["run_time_ms"] * 1000)
    assert all(sample["micro_batches"] == 1 for sample in doc["models"]["samples"])
    assert not any(w.startswith(DIFFERING_CALLS) for w in doc["warnings"])


@pytest.mark.parametrize("predict", [True, False])
@pytest.mark.parametrize("entry", ["four_chunks.py", "chunks.py"])
def test_a_batch_split_between_calls_is_one_batch_from_the_first_result_on(entry, predict):
    # x.chunk(4) runs the model four times at every batch size, as accumulation does, but on a
    # quarter of the batch each: it was counted as four micro-batches of 64 samples (163,655
    # samples/s for about 41,000), as x.split(16) was without a second batch size (--no-predict).
    doc = analysed_loop(entry, predict=predict)
    assert doc["iteration"]["micro_batches"] == 1
    assert doc["iteration"]["samples_per_second"] == pytest.approx(
        doc["batch_size"] / doc["iteration"]["run_time_ms"] * 1000
    )


def test_sharpness_aware_minimization_evaluates_one_batch_twice_and_its_ascent_is_the_update():
    # Its two passes over the same batch read as two micro-batches: twice the throughput.
    doc = analysed_loop("sharpness_aware.py")
    assert doc["iteration"]["micro_batches"] == 1 and doc["models"]["micro_batches"] == 1
    assert doc["models"]["samples_per_step"] is None
    ascent = line(doc, "sharpness_aware.py", marked("sharpness_aware.py", "ASCEND"))
    assert ascent["step_ms"] > 0 and ascent["forward_ms"] == 0


@pytest.mark.parametrize("entry", ["optimizers.py", "evaluates.py"])
def test_one_micro_batch_without_accumulation(entry):
    # optimizers.py calls the model once; evaluates.py twice, the second time without gradients.
    assert analysed_loop(entry, predict=False)["iteration"]["micro_batches"] == 1


def test_lbfgs_is_measured_with_its_history_full_and_its_closure_is_no_micro_batch():
    # Measured after the warm-up's two steps, its history (two vectors of all the parameters per
    # inner iteration, 20 kept) read as a leak of 680 KB an iteration and the batch-size models
    # were withheld; its two closure calls a step read as two micro-batches (twice the throughput).
    doc = analysed_loop("lbfgs.py")
    assert doc["memory_growth"] is None and doc["models"] is not None
    assert doc["iteration"]["micro_batches"] == 1 and doc["models"]["micro_batches"] == 1
    (state,) = doc["optimizer_state"]
    history = 2 * 20 * FLOAT32 * (BODY + HEAD)  # lbfgs.py's HISTORY_SIZE
    assert state["name"] == "LBFGS" and history <= state["size_bytes"] <= history + 3 * FLOAT32 * (BODY + HEAD)
    assert (state["contexts"][0]["path"], state["contexts"][0]["line"]) == ("lbfgs.py", marked("lbfgs.py", "LBFGS"))
    assert doc["iteration"]["peak_memory_bytes"] > history


def test_several_optimizers_and_parameter_groups_each_at_their_constructor():
    doc = analysed_loop("optimizers.py", predict=False)
    found = [(s["name"], s["size_bytes"], s["contexts"][0]["line"]) for s in doc["optimizer_state"]]
    assert found == [
        ("SGD", FLOAT32 * BODY, 19),  # a momentum buffer for each parameter of both groups
        ("Adam", 2 * FLOAT32 * HEAD + 2 * ADAM_STEPS, 25),
    ]
    for number in (32, 33):  # body.step(), head.step()
        assert line(doc, "optimizers.py", number)["step_ms"] > 0


# tests/projects/training_loops/gan.py: Linear(16, 64), Linear(64, 64); Linear(64, 64), Linear(64, 1).
GENERATOR = (16 * 64 + 64) + (64 * 64 + 64)
DISCRIMINATOR = (64 * 64 + 64) + (64 * 1 + 1)


def test_two_optimizers_of_one_class_each_at_the_constructor_of_the_name_that_steps_it():
    # The discriminator's Adam steps first but is constructed second: each Adam's state is at the
    # line that made the optimizer its code steps, not at the first Adam of the file.
    doc = analysed_loop("gan.py", predict=False)
    source = (PROJECT / "gan.py").read_text().splitlines()
    constructed = {
        name: number
        for number, text in enumerate(source, start=1)
        for name in ("generator_optimizer", "discriminator_optimizer")
        if text.strip().startswith(f"{name} = ")
    }
    found = {s["size_bytes"]: s["contexts"][0]["line"] for s in doc["optimizer_state"]}
    assert found == {
        2 * FLOAT32 * GENERATOR + 4 * ADAM_STEPS: constructed["generator_optimizer"],
        2 * FLOAT32 * DISCRIMINATOR + 4 * ADAM_STEPS: constructed["discriminator_optimizer"],
    }


def test_optimizers_held_by_a_trainer_each_at_the_constructor_of_its_attribute(tmp_path):
    (tmp_path / "entry_point.py").write_text(
        textwrap.dedent(
            """\
            import torch


            class Trainer:
                def __init__(self, model):
                    self.critic_optimizer = torch.optim.SGD(model[1].parameters(), lr=0.01, momentum=0.9)
                    self.actor_optimizer = torch.optim.SGD(model[0].parameters(), lr=0.01, momentum=0.9)
                    self.model = model

                def step(self, x):
                    self.actor_optimizer.zero_grad()
                    self.critic_optimizer.zero_grad()
                    self.model(x).pow(2).mean().backward()
                    self.actor_optimizer.step()
                    self.critic_optimizer.step()


            def skyline_model_provider():
                return torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Linear(32, 1))


            def skyline_input_provider(batch_size=4):
                return (torch.randn(batch_size, 8),)


            def skyline_iteration_provider(model):
                return Trainer(model).step
            """
        )
    )
    doc = analysed(tmp_path, budget=SERVE_QUICK, predict=False)
    found = {s["size_bytes"]: s["contexts"][0]["line"] for s in doc["optimizer_state"]}
    # A momentum buffer for each parameter: the actor's Linear(8, 32), the critic's Linear(32, 1).
    assert found == {FLOAT32 * (8 * 32 + 32): 7, FLOAT32 * (32 + 1): 6}


def test_an_iteration_under_anomaly_detection_is_told_where_it_is_turned_on():
    # It made an MLP's iteration twice as slow, side by side: the times are the debugging's.
    doc = analysed_loop("detects_anomalies.py", predict=False)
    (warning,) = [w for w in doc["warnings"] if w.startswith("Autograd's anomaly detection was on")]
    assert f"(detects_anomalies.py:{marked('detects_anomalies.py', 'ANOMALY')})" in warning
    assert "torch.autograd.set_detect_anomaly(False)" in warning
    assert not torch.is_anomaly_enabled()  # the user's context manager, not the analysis, turned it on


DIFFERING_CALLS = "Your iteration does not do the same work on every call"


def test_an_iteration_that_steps_every_fourth_call_is_told_its_calls_differ_and_recorded_for_a_cycle():
    doc = analysed_loop("accumulates_across_calls.py", predict=False)
    (warning,) = [w for w in doc["warnings"] if w.startswith(DIFFERING_CALLS)]
    assert "stepped no optimizer and" in warning and "made one optimizer step (one call in 4)" in warning
    assert "measured it in whole cycles of 4 calls" in warning and "make one call one whole cycle" in warning
    # The breakdown averages the four calls of a cycle: the step's line has its time, whichever
    # call the analysis recorded first.
    assert doc["attribution"]["recorded_iterations"] == 4
    assert line(doc, "accumulates_across_calls.py", marked("accumulates_across_calls.py", "STEP"))["step_ms"] > 0


def test_a_generator_stepped_every_fifth_call_is_told_recorded_for_a_cycle_and_its_optimizer_state_found():
    doc = analysed_loop("critic_steps.py", predict=False)
    (warning,) = [w for w in doc["warnings"] if w.startswith(DIFFERING_CALLS)]
    assert "made one optimizer step and" in warning and "made 2 optimizer steps (one call in 5)" in warning
    assert doc["attribution"]["recorded_iterations"] == 5
    assert line(doc, "critic_steps.py", marked("critic_steps.py", "GENERATOR_LOSS"))["backward_ms"] > 0
    assert line(doc, "critic_steps.py", marked("critic_steps.py", "GENERATOR_STEP"))["step_ms"] > 0
    # RMSprop keeps one square average per parameter (and a step count per parameter).
    generator, critic = (16 * 64 + 64) + (64 * 64 + 64), (64 * 64 + 64) + (64 + 1)
    found = sorted(s["size_bytes"] for s in doc["optimizer_state"])
    assert found == sorted([FLOAT32 * critic + 4 * ADAM_STEPS, FLOAT32 * generator + 4 * ADAM_STEPS])


def test_calls_that_differ_in_a_cycle_are_measured_in_whole_cycles():
    # Each batch size's peak is that of one whole cycle starting where a cycle starts, so the
    # per-operation memory model reproduces every measured peak (one call's peaks, with or without
    # the generator's step, had missed it by up to 32 %); each timed block holds whole cycles.
    doc = analysed_loop("critic_steps.py")
    (warning,) = [w for w in doc["warnings"] if w.startswith(DIFFERING_CALLS)]
    assert "Skyline measured it in whole cycles of 5 calls" in warning
    models = doc["models"]
    assert models["peak_memory_bytes"]["fitted"] == "per_operation"
    assert models["peak_memory_bytes"]["max_relative_residual"] < 1e-9
    assert [s["repetitions"] % 5 for s in models["samples"]] == [0] * len(models["samples"])
    # The operation at the peak is found among the recorded cycle's, one for one with its profile.
    assert doc["peak_memory_operation"] is not None


def test_an_evaluation_every_fifth_call_is_told_and_measured_in_whole_cycles():
    # The steps do not tell these calls apart, the passes through the model do. Measured call by
    # call, the time left the evaluation out (the lower quartile of blocks leaned to the blocks
    # without it: 2.4 ms for 3.7 ms a call, averaged over a cycle, in a larger trial), and so did
    # the breakdown and the peak.
    doc = analysed_loop("evaluates_every_few_calls.py", predict=False)
    (warning,) = [w for w in doc["warnings"] if w.startswith(DIFFERING_CALLS)]
    assert "ran the model once and" in warning and "ran the model twice (one call in 5)" in warning
    assert "optimizer" not in warning.split(".")[0]
    assert "Skyline measured it in whole cycles of 5 calls" in warning
    assert doc["attribution"]["recorded_iterations"] == 5
    assert doc["iteration"]["repetitions"] % 5 == 0  # the user's batch size, timed in whole cycles
    evaluation = line(doc, "evaluates_every_few_calls.py", marked("evaluates_every_few_calls.py", "EVALUATE"))
    assert evaluation["inclusive"]["forward_ms"] > 0
    # The peak is the evaluation's: two of its 1,024 × 256 activations at once, beyond the weights,
    # their gradients and the 32-sample batch's activations.
    weights_and_grads = 2 * FLOAT32 * (BODY + HEAD)
    assert doc["iteration"]["peak_memory_bytes"] >= weights_and_grads + 2 * FLOAT32 * 1024 * 256


@pytest.mark.parametrize(
    "entry", ["eager.py", "accumulation.py", "mixed_precision.py", "optimizers.py", "gan.py", "evaluates.py"]
)
def test_iterations_whose_calls_all_step_alike_are_not_told_they_differ(entry):
    # A GradScaler's first skipped steps are warm-up; accumulation inside one call, two optimizers
    # each call, a model run several times each call: every call does the same work.
    doc = analysed_loop(entry, predict=False)
    assert not any(w.startswith(DIFFERING_CALLS) for w in doc["warnings"])


WARMED_UP = """
import torch

CALLS = []


class MomentumFromItsSecondStep(torch.optim.Optimizer):
    # The user's own optimizer: plain SGD at its first step, momentum made at its second.
    def __init__(self, params, grows):
        super().__init__(params, {"lr": 0.01})
        self.grows = grows

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                state = self.state[p]
                state["step"] = state.get("step", torch.zeros(())) + 1
                if self.grows and state["step"] >= 2:
                    state.setdefault("momentum", torch.zeros_like(p)).mul_(0.9).add_(p.grad)
                p.add_(state.get("momentum", p.grad), alpha=-group["lr"])


def skyline_model_provider():
    return MODEL


def skyline_input_provider(batch_size=8):
    return (torch.randn(batch_size, 16),)


def skyline_iteration_provider(model):
    optimizer = OPTIMIZER

    def iteration(x):
        CALLS.append(1)
        optimizer.zero_grad()
        model(x).sum().backward()
        optimizer.step()

    return iteration
"""


LINEAR = "torch.nn.Linear(16, 4)"


@pytest.mark.parametrize(
    ("optimizer", "model", "warm_up_calls"),
    [
        # torch's own make all their state in their first step: one warm-up iteration.
        ("torch.optim.AdamW(model.parameters())", LINEAR, 1),
        # Another's state may grow at its second step: one more iteration checks it did not ...
        ("MomentumFromItsSecondStep(model.parameters(), grows=False)", LINEAR, 2),
        # ... or, where it did, runs on until it stays the same size 3 calls in a row.
        ("MomentumFromItsSecondStep(model.parameters(), grows=True)", LINEAR, 2 + 3),
        # A TorchScript part optimizes in its second call the graph it profiled in its first.
        ("torch.optim.AdamW(model.parameters())", f"torch.nn.Sequential(torch.jit.script({LINEAR}))", 2),
    ],
)
def test_the_warm_up_runs_a_second_iteration_only_where_the_optimizers_state_may_still_grow(
    tmp_path, optimizer, model, warm_up_calls
):
    entry = tmp_path / "entry_point.py"
    entry.write_text(WARMED_UP.replace("OPTIMIZER", optimizer).replace("MODEL", model))
    loaded = load_entry_point(entry, tmp_path)
    try:
        with IterationRunner(loaded, torch.device("cpu"), SERVE_QUICK) as runner, runner.at_batch_size(8) as run:
            runner.warm_up(run)
            assert len(loaded.module.CALLS) == warm_up_calls
            # The memory measured next is the steady state's: the momentum counted where it grew.
            assert runner.memory(run).peak_bytes == runner.memory(run).peak_bytes
    finally:
        loaded.unload()
