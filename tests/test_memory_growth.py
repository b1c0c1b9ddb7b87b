"""Tensor memory an iteration keeps for good (a leak) is found, named at the lines that made it,
and keeps the batch-size models from comparing peaks measured after different numbers of
iterations; training loops that only replace what they keep are left alone.

The loops below run on real torch; the byte counts are computed here from the tensors' shapes.
"""

from __future__ import annotations

import collections
from pathlib import Path

import pytest
import torch
import torch.nn as nn

from engine_helpers import SERVE_QUICK, analysed
from skyline_engine.attribute.memory_growth import GROWING_MEMORY, MemoryGrowth
from skyline_engine.measure.retention import measure_retention
from skyline_engine.render.terminal import render_report

PROJECT = Path(__file__).parent / "projects" / "training_loops"
FLOAT32 = 4
BATCH = 32  # the projects' default batch size
HIDDEN = 256  # tests/projects/training_loops/model.py
CLASSES = 10


def mlp_and_adam():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, CLASSES))
    return model, torch.optim.Adam(model.parameters()), torch.randn(BATCH, 64), torch.randint(0, CLASSES, (BATCH,))


def steady(run, model, warm_up=4):
    for _ in range(warm_up):
        run()
    return measure_retention(run, model, torch.device("cpu"))


@pytest.mark.slow  # real training iterations, measured by the engine (measure_retention)
def test_a_graph_kept_alive_is_kept_memory_at_the_operations_that_made_it():
    model, optimizer, x, y = mlp_and_adam()
    kept = []

    def iteration():
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward(retain_graph=True)
        optimizer.step()
        kept.append(loss)

    retention = steady(iteration, model)
    by_name = {retention.operation_names[i]: size for i, size in retention.kept_bytes.items()}
    # ReLU saves its output for the backward pass (and the second Linear its input, the same tensor).
    assert by_name["relu.default"] == BATCH * HIDDEN * FLOAT32
    assert by_name["_log_softmax.default"] == BATCH * CLASSES * FLOAT32
    assert retention.bytes_per_iteration == sum(by_name.values())


@pytest.mark.slow  # real training iterations, measured by the engine (measure_retention)
def test_detached_outputs_kept_in_a_list_are_kept_memory():
    model, optimizer, x, y = mlp_and_adam()
    history = []

    def iteration():
        optimizer.zero_grad()
        out = model(x)
        nn.functional.cross_entropy(out, y).backward()
        optimizer.step()
        history.append(out.detach())

    retention = steady(iteration, model)
    assert retention.bytes_per_iteration == BATCH * CLASSES * FLOAT32
    assert [retention.operation_names[i] for i in retention.kept_bytes] == ["addmm.default"]


@pytest.mark.slow  # real training iterations, measured by the engine (measure_retention)
def test_loops_that_replace_what_they_keep_keep_nothing():
    model, optimizer, x, y = mlp_and_adam()
    step = [0]

    def accumulates_over_four_iterations():
        # The gradients live across iterations until the step: kept legitimately, not a leak.
        nn.functional.cross_entropy(model(x), y).backward()
        step[0] += 1
        if step[0] % 4 == 0:
            optimizer.step()
            optimizer.zero_grad()

    def zeroes_in_place_with_momentum():
        sgd.zero_grad(set_to_none=False)
        nn.functional.cross_entropy(model(x), y).backward()
        sgd.step()

    lstm, head = nn.LSTM(16, 32, batch_first=True), nn.Linear(32, 1)
    both = nn.ModuleList([lstm, head])
    lstm_optimizer, sequence, state = torch.optim.Adam(both.parameters()), torch.randn(8, 10, 16), [None]

    def truncated_backpropagation_through_time():
        # The hidden state is kept for the next iteration, which replaces it.
        lstm_optimizer.zero_grad()
        out, hidden = lstm(sequence, state[0])
        state[0] = tuple(h.detach() for h in hidden)
        head(out).pow(2).mean().backward()
        lstm_optimizer.step()

    recent = []

    def keeps_the_last_two_outputs():
        # Each output lives through the next iteration too (a consistency loss against the one
        # before last, say), then is dropped: kept for a while, not for good.
        optimizer.zero_grad()
        out = model(x)
        loss = nn.functional.cross_entropy(out, y)
        if len(recent) == 2:
            loss = loss + (out - recent.pop(0)).pow(2).mean()
        loss.backward()
        optimizer.step()
        recent.append(out.detach())

    window = collections.deque(maxlen=8)

    def keeps_a_window_of_recent_outputs():
        # Full since the warm-up: each output lives for eight iterations, and each iteration drops
        # one made eight before. Kept for long, but memory does not grow.
        optimizer.zero_grad()
        out = model(x)
        nn.functional.cross_entropy(out, y).backward()
        optimizer.step()
        window.append(out.detach())

    def builds_a_graph_it_never_backwards():
        # The accuracy is computed with gradients on: the graph that made it (ReLU saved its output)
        # is dropped without a backward pass. Autograd frees it; saved-tensor hooks that kept the
        # tensor itself would not (measure/saved_tensors.py).
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
        (model(x).argmax(1) == y).float().mean().item()

    scaler = torch.amp.GradScaler("cpu")

    def mixed_precision():
        optimizer.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = nn.functional.cross_entropy(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()

    sgd = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    assert steady(accumulates_over_four_iterations, model).kept_bytes == {}
    assert steady(zeroes_in_place_with_momentum, model).kept_bytes == {}
    assert steady(truncated_backpropagation_through_time, both).kept_bytes == {}
    assert steady(mixed_precision, model).kept_bytes == {}
    assert steady(keeps_the_last_two_outputs, model).kept_bytes == {}
    assert steady(keeps_a_window_of_recent_outputs, model, warm_up=10).kept_bytes == {}
    assert steady(builds_a_graph_it_never_backwards, model).kept_bytes == {}


@pytest.mark.slow  # real training iterations, measured by the engine (measure_retention)
def test_a_leak_beside_memory_kept_for_a_while_is_measured_alone():
    # Each loop leaks its output (BATCH × CLASSES floats an iteration) and keeps more for a while:
    # a hidden activation through the next iteration, or gradients accumulated over four. Memory
    # grows, so the growth does not decide: that the first iteration's tensors must outlive two
    # more, and that gradients are left out, do.
    model, optimizer, x, y = mlp_and_adam()
    leaked, recent, step = [], collections.deque(maxlen=2), [0]

    def keeps_each_hidden_through_the_next_iteration():
        optimizer.zero_grad()
        hidden = model[0](x)
        out = model[2](model[1](hidden))
        nn.functional.cross_entropy(out, y).backward()
        optimizer.step()
        recent.append(hidden.detach())  # made in one iteration, dropped in the one after next
        leaked.append(out.detach())

    def accumulates_over_four_iterations():
        # Warmed up for four: stepped and zeroed just before, so the first measured iteration
        # makes the gradients, and the next two add to them in place.
        out = model(x)
        nn.functional.cross_entropy(out, y).backward()
        leaked.append(out.detach())
        step[0] += 1
        if step[0] % 4 == 0:
            optimizer.step()
            optimizer.zero_grad()

    for loop in (keeps_each_hidden_through_the_next_iteration, accumulates_over_four_iterations):
        retention = steady(loop, model)
        assert retention.bytes_per_iteration == BATCH * CLASSES * FLOAT32, loop.__name__
        assert [retention.operation_names[i] for i in retention.kept_bytes] == ["addmm.default"], loop.__name__


@pytest.fixture(scope="module")
def keeps_graphs():
    return analysed(PROJECT, "keeps_graphs.py", budget=SERVE_QUICK)


@pytest.mark.slow
def test_an_analysis_names_the_lines_whose_memory_is_kept(keeps_graphs):
    doc = keeps_graphs
    growth = doc["memory_growth"]
    # model.py:12, `hidden = self.body(x)`: both ReLUs' outputs, saved by the graph kept alive.
    assert growth["lines"][0] == {"path": "model.py", "line": 12, "bytes": 2 * BATCH * HIDDEN * FLOAT32}
    assert growth["bytes_per_iteration"] >= 2 * BATCH * HIDDEN * FLOAT32 + BATCH * CLASSES * FLOAT32
    assert growth["bytes_per_iteration"] == sum(line["bytes"] for line in growth["lines"])
    warning = next(w for w in doc["warnings"] if w.startswith("Tensor memory grows by"))
    assert "made at model.py:12 (64.0 KiB)" in warning
    assert "append `loss.item()`" in warning


@pytest.mark.slow
def test_peaks_that_grow_with_each_iteration_withhold_the_models(keeps_graphs):
    doc = keeps_graphs
    assert doc["models"] is None and doc["predictions"] == []
    assert doc["models_withheld"] == GROWING_MEMORY
    # The user's batch size alone, timed in full: no other was measured after more iterations.
    assert doc["iteration"]["batch_size"] == BATCH and doc["iteration"]["repetitions"] > 1
    summary = render_report(doc).split("\n\n")[1]
    assert "Batch size   none to recommend: peak memory grows with every iteration (see the warnings)" in summary


@pytest.mark.slow
def test_a_leak_too_small_to_move_the_peaks_is_told_and_the_models_kept():
    doc = analysed(PROJECT, "keeps_losses.py", budget=SERVE_QUICK)
    # The loss itself, a float32 scalar, made by the loss function at model.py:14.
    assert doc["memory_growth"] == {
        "bytes_per_iteration": FLOAT32,
        "lines": [{"path": "model.py", "line": 14, "bytes": FLOAT32}],
    }
    assert any(w.startswith("Tensor memory grows by 4 B with every iteration") for w in doc["warnings"])
    assert doc["models"] is not None and doc["models_withheld"] is None


@pytest.mark.slow
@pytest.mark.parametrize("entry", ["eager.py", "accumulation.py", "mixed_precision.py", "optimizers.py", "gan.py"])
def test_training_loops_that_keep_nothing_have_no_memory_growth(entry):
    doc = analysed(PROJECT, entry, budget=SERVE_QUICK, predict=False)
    assert doc["memory_growth"] is None
    assert not any(w.startswith("Tensor memory grows") for w in doc["warnings"])


def test_the_growth_that_withholds_the_models_is_a_ten_thousandth_of_the_peak_per_iteration():
    assert not MemoryGrowth(99, ()).skews_peaks(1_000_000)
    assert MemoryGrowth(100, ()).skews_peaks(1_000_000)
    # Without the recorded iteration's lines, the warning says how much, and where is left out.
    assert MemoryGrowth(2048, ()).warning().startswith("Tensor memory grows by 2.0 KiB with every iteration: what")
