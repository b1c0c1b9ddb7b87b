"""The recorder (attribute/recorder.py) on purpose-built iterations, recorded one to three times: the
phase of each operation where optimizers step inside one another or the model runs without
gradients after the step; the CPU timer's times; gradient accumulation told from the recorded
iteration itself (Recording.micro_batches: the model called k times, k gradients accumulated into
its parameters and each optimizer stepping once is k micro-batches per step, calls inside a step
(a closure) aside, and calls that split one batch between them, or all take the same one, too;
anything else is one); several recorded iterations broken down (each operation's fastest time where
they ran the same operations; on a busy CPU, its thread's CPU time)."""

from __future__ import annotations

import textwrap
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest
import torch

from engine_helpers import marked_line
from skyline_engine.attribute import recorder as recorder_module
from skyline_engine.attribute.breakdown import Breakdown
from skyline_engine.attribute.creation import CreationSites
from skyline_engine.attribute.frames import CallSites
from skyline_engine.attribute.kernels import KernelCapture
from skyline_engine.attribute.recorder import OperationRecord, Recording
from skyline_engine.attribute.recording import (
    BUSY_RECORDING_LIMIT_MS,
    RECORDING_LIMIT_MS,
    IterationRecording,
    recorded_iterations,
)
from skyline_engine.entry.loader import load_entry_point
from skyline_engine.measure.iteration import IterationRunner
from skyline_engine.measure.memory import MemoryProfile
from skyline_engine.measure.timing import TimingBudget
from skyline_engine.vocabulary import BACKWARD, FORWARD, OPTIMIZER

pytestmark = pytest.mark.slow  # the engine's iteration runner, each test

ENTRY = "entry.py"  # in each test's own project folder
BATCH_SIZE = 12
PROVIDERS = """
import torch


def skyline_model_provider():
    return torch.nn.Linear(8, 4)


def skyline_input_provider(batch_size=4):
    return (torch.randn(batch_size, 8),)
"""

LOOPS = {
    # (the iteration provider, the micro-batches it runs per optimizer step)
    "two micro-batches": (
        """
        def skyline_iteration_provider(model):
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            def iteration(x):
                optimizer.zero_grad()
                for micro_batch in (x, x.flip(0)):
                    model(micro_batch).sum().backward()
                optimizer.step()
            return iteration
        """,
        2,
    ),
    "a batch split in two halves": (
        """
        def skyline_iteration_provider(model):
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            def iteration(x):
                optimizer.zero_grad()
                for half in x.chunk(2):
                    model(half).sum().backward()
                optimizer.step()
            return iteration
        """,
        1,
    ),
    "two optimizers, each stepping once": (
        """
        def skyline_iteration_provider(model):
            weights = torch.optim.SGD([model.weight], lr=0.1)
            bias = torch.optim.Adam([model.bias], lr=0.1)
            def iteration(x):
                for micro_batch in (x, x + 1, x * 2):
                    model(micro_batch).sum().backward()
                weights.step()
                bias.step()
            return iteration
        """,
        3,
    ),
    "two steps, one after each micro-batch": (
        """
        def skyline_iteration_provider(model):
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            def iteration(x):
                for half in x.chunk(2):
                    optimizer.zero_grad()
                    model(half).sum().backward()
                    optimizer.step()
            return iteration
        """,
        1,
    ),
    "no optimizer": (
        """
        def skyline_iteration_provider(model):
            def iteration(x):
                for half in x.chunk(2):
                    model(half).sum().backward()
                model.zero_grad()
            return iteration
        """,
        1,
    ),
    "a closure the step evaluates three times (LBFGS)": (
        """
        def skyline_iteration_provider(model):
            optimizer = torch.optim.LBFGS(model.parameters(), max_iter=3, tolerance_grad=0, tolerance_change=0)
            def iteration(x):
                def closure():
                    optimizer.zero_grad()
                    # A new tensor each evaluation: the same one would be one batch evaluated again.
                    loss = model(x.clone()).square().mean()
                    loss.backward()
                    return loss
                optimizer.step(closure)
            return iteration
        """,
        1,
    ),
    "the same batch twice (sharpness-aware minimization)": (
        """
        def skyline_iteration_provider(model):
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            def iteration(x):
                model(x).sum().backward()
                with torch.no_grad():
                    for p in model.parameters():
                        p.add_(p.grad, alpha=0.05)
                optimizer.zero_grad()
                model(x).sum().backward()
                optimizer.step()
            return iteration
        """,
        1,
    ),
    "adversarial examples, whose gradients reach the input alone": (
        """
        def skyline_iteration_provider(model):
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            def iteration(x):
                delta = torch.zeros_like(x, requires_grad=True)
                for _ in range(2):
                    (grad,) = torch.autograd.grad(model(x + delta).sum(), delta)
                    delta = (delta + 0.01 * grad.sign()).detach().requires_grad_(True)
                optimizer.zero_grad()
                model(x + delta).sum().backward()
                optimizer.step()
            return iteration
        """,
        1,
    ),
    "one backward pass for two calls": (
        """
        def skyline_iteration_provider(model):
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            def iteration(x):
                first, second = x.chunk(2)
                (model(first).sum() + model(second).sum()).backward()
                optimizer.step()
            return iteration
        """,
        1,
    ),
}


@dataclass
class Recorded:
    recording: Recording
    micro_batches: int
    memory: MemoryProfile  # of the first recorded iteration
    iterations: IterationRecording


def recorded(
    project: Path,
    loop: str,
    iterations: int = 1,
    kernel_capture: Callable[[], KernelCapture] | None = None,
    busy: bool = False,
) -> Recorded:
    """`iterations` (1 to 3) recorded iterations of the entry point `PROVIDERS` + `loop`; with
    `kernel_capture`, each operation's kernels captured as on CUDA (tests/test_kernels.py); `busy`:
    the more recorded as on a machine other processes kept busy."""
    (project / ENTRY).write_text(PROVIDERS + textwrap.dedent(loop), encoding="utf-8")
    entry = load_entry_point(project / ENTRY, project)
    device = torch.device("cpu")
    creation = CreationSites(CallSites(entry.files))
    with creation.recording_modules():
        runner = IterationRunner(entry, device, TimingBudget())
    with runner, runner.at_batch_size(BATCH_SIZE) as run:
        iteration_recording = IterationRecording(creation, runner.model, device, kernel_capture=kernel_capture)
        memory, _ = iteration_recording.record_first(run, runner.clock, runner.live_tensors)
        if iterations > 1:
            # As many as fit the recording limit, where that is fewer than the minimum (recorded_iterations).
            limit_ms = BUSY_RECORDING_LIMIT_MS if busy else RECORDING_LIMIT_MS
            iteration_recording.record_more(run, run_time_ms=limit_ms // iterations, busy=busy)
    recording = iteration_recording.recorder.recording
    assert len(recording.iteration_starts) == iterations
    return Recorded(recording, iteration_recording.micro_batches(BATCH_SIZE), memory, iteration_recording)


@pytest.mark.parametrize("iterations", [1, 2])
@pytest.mark.parametrize("case", sorted(LOOPS))
def test_micro_batches_are_counted_in_the_first_iteration(tmp_path, case, iterations):
    loop, micro_batches = LOOPS[case]
    assert recorded(tmp_path, loop, iterations).micro_batches == micro_batches


def test_the_first_iteration_ends_where_the_second_starts(tmp_path):
    recording = recorded(tmp_path, LOOPS["two micro-batches"][0], iterations=2).recording
    first = recording.first_iteration()
    second = recording.operations[recording.iteration_starts[1] :]
    assert [op.name for op in first] == [op.name for op in second]
    assert recording.model_calls == 2  # the first iteration's, not both


def marked(operations: list[OperationRecord], project: Path, marker: str) -> list[OperationRecord]:
    """The operations recorded at the line of the project's entry point marked `# marker`."""
    number = marked_line(project / ENTRY, f"# {marker}")
    return [op for op in operations if op.context == (ENTRY, number)]


def test_the_work_of_an_optimizer_stepped_inside_another_is_the_optimizers(tmp_path):
    # A wrapper that steps its inner optimizer, then updates on its own (as Lookahead does): the
    # work after the inner step is still inside the outer step.
    loop = """
        class Averaged(torch.optim.Optimizer):
            def __init__(self, inner):
                self.inner = inner
                super().__init__(inner.param_groups, {})
                self.average = [p.detach().clone() for p in inner.param_groups[0]["params"]]

            @torch.no_grad()
            def step(self):
                self.inner.step()
                for average, p in zip(self.average, self.inner.param_groups[0]["params"]):
                    average.lerp_(p, 0.5)  # OUTER

        def skyline_iteration_provider(model):
            optimizer = Averaged(torch.optim.SGD(model.parameters(), lr=0.1))
            def iteration(x):
                model(x).sum().backward()
                optimizer.step()
                model.zero_grad()
            return iteration
        """
    operations = recorded(tmp_path, loop).recording.operations
    outer = marked(operations, tmp_path, "OUTER")
    assert [op.name for op in outer] == ["lerp_", "lerp_"]  # the weight's and the bias's
    assert {op.phase for op in outer} == {OPTIMIZER}


def test_the_model_run_without_gradients_after_the_step_is_forward_work(tmp_path):
    loop = """
        def skyline_iteration_provider(model):
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            def iteration(x):
                optimizer.zero_grad()
                model(x).sum().backward()
                optimizer.step()
                with torch.no_grad():
                    model(x).argmax(dim=1)  # EVALUATE
            return iteration
        """
    operations = recorded(tmp_path, loop, iterations=2).recording.operations
    evaluation = marked(operations, tmp_path, "EVALUATE")
    assert [op.name for op in evaluation] == ["t", "addmm", "argmax"] * 2  # the Linear's and argmax, each iteration
    assert {op.phase for op in evaluation} == {FORWARD}
    assert {op.phase for op in operations} == {FORWARD, BACKWARD, OPTIMIZER}


def test_each_operation_is_timed_within_the_recording_one_after_another(tmp_path):
    loop = LOOPS["two micro-batches"][0]
    started = time.perf_counter_ns()
    recording = recorded(tmp_path, loop, iterations=2).recording
    elapsed_ms = (time.perf_counter_ns() - started) / 1e6
    assert recording.operations and all(op.duration_ms > 0 for op in recording.operations)
    # Each recorded iteration is timed from the moment the recorder was entered for it; on the
    # CPU, its operations run one at a time on the iteration's thread (backward too).
    first, second = recording.iteration_starts
    for operations in (recording.operations[first:second], recording.operations[second:]):
        for before, after in zip(operations, operations[1:]):
            assert after.start_ms >= before.start_ms + before.duration_ms
        assert operations[0].start_ms >= 0 and operations[-1].start_ms + operations[-1].duration_ms <= elapsed_ms


def test_an_operation_leaving_two_tensors_for_backward_holds_the_bytes_of_both(tmp_path):
    loop = """
        def skyline_iteration_provider(model):
            def iteration(x):
                var, mean = torch.var_mean(model(x), dim=1)  # BOTH
                (var * mean).sum().backward()  # `mul` saves both operands
                model.zero_grad()
            return iteration
        """
    operations = recorded(tmp_path, loop).recording.operations
    (var_mean,) = [op for op in marked(operations, tmp_path, "BOTH") if op.name == "var_mean"]
    assert var_mean.activation_bytes == 2 * 12 * 4  # two float32 values for each of 12 samples


def test_a_module_outside_the_model_is_named_by_its_class(tmp_path):
    loop = """
        def skyline_iteration_provider(model):
            loss_function = torch.nn.MSELoss()
            def iteration(x):
                loss = loss_function(model(x), torch.zeros(len(x), 4))  # LOSS
                loss.backward()
                model.zero_grad()
            return iteration
        """
    recording = recorded(tmp_path, loop).recording
    forward = [op for op in marked(recording.operations, tmp_path, "LOSS") if op.phase == FORWARD]
    assert [(op.name, op.module) for op in forward] == [
        ("t", "model"),
        ("addmm", "model"),
        ("zeros", ""),  # outside any module
        ("mse_loss", "MSELoss"),
    ]
    (line,) = {op.context for op in forward}
    assert [(call.path, call.context) for call in recording.module_calls] == [("model", line), ("MSELoss", line)]


def test_each_call_of_a_users_module_is_an_invocation_of_its_lines(tmp_path):
    # Invocations: the user's module calls, each its own; torch's modules run within their caller's.
    loop = """
        class Block(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.inner = torch.nn.Linear(8, 8)

            def forward(self, x):
                return self.inner(x).relu()  # BLOCK

        def skyline_iteration_provider(model):
            block = Block()
            def iteration(x):
                h = block(block(x * 2))  # TWICE
                model(h).sum().backward()  # MODEL
                model.zero_grad()
            return iteration
        """
    operations = [op for op in recorded(tmp_path, loop).recording.operations if op.phase == FORWARD]
    blocks = marked(operations, tmp_path, "BLOCK")
    assert [op.name for op in blocks] == ["t", "addmm", "relu"] * 2
    first, second = {op.invocation[0] for op in blocks[:3]}, {op.invocation[0] for op in blocks[3:]}
    assert len(first) == len(second) == 1 and first != second and 0 not in first | second
    # Outside any of the user's modules (torch's Linear as the model included): no invocation.
    outside = marked(operations, tmp_path, "TWICE") + marked(operations, tmp_path, "MODEL")
    assert [op.name for op in outside] == ["mul", "t", "addmm", "sum", "ones_like"]  # ones_like: backward's seed
    assert {op.invocation[0] for op in outside} == {0}


def test_the_memory_profile_sees_each_operations_outputs(tmp_path):
    loop = """
        def skyline_iteration_provider(model):
            def iteration(x):
                big = torch.ones(1 << 20)  # BIG
                (model(x).sum() * big.mean()).backward()
                model.zero_grad()
            return iteration
        """
    result = recorded(tmp_path, loop)
    first = result.recording.operations
    # Named by overload (`ones.default`), each after its recorded operation.
    assert [name.split(".")[0] for name in result.memory.operation_names] == [op.name for op in first]
    (ones,) = [n for n, op in enumerate(first) if op in marked(first, tmp_path, "BIG")]
    before = result.memory.operation_bytes[ones - 1] if ones else result.memory.start_bytes
    assert result.memory.operation_bytes[ones] - before >= 4 << 20  # a MiB of float32 ones


def test_backward_work_carries_its_nodes_name_and_the_module_of_the_operation_that_made_the_node(tmp_path):
    backward = [op for op in recorded(tmp_path, STEPS).recording.operations if op.phase == BACKWARD]
    linked = [op for op in backward if op.creator is not None]
    assert {(op.node_name, op.creator.name, op.module) for op in linked} == {
        ("SumBackward0", "sum", ""),  # outside any module
        ("AddmmBackward0", "addmm", "model"),
        ("TBackward0", "t", "model"),
    }
    # Gradient accumulation into the weight and the bias: no forward operation made those nodes,
    # so the operation tree names the work after them (attribute/breakdown.py).
    unlinked = [(op.name, op.node_name, op.module) for op in backward if op.creator is None]
    assert unlinked == [("detach", "torch::autograd::AccumulateGrad", "")] * 2


# -- several recorded iterations, broken down ------------------------------------------------------
# Each operation's time is its fastest over iterations that ran the same operations at the same
# lines: a slow first recorded iteration (the recorder's code running cold) or an operation that
# waited for a CPU, in any number of iterations but one, does not count; iterations that differ
# keep their mean. The iterations are recorded
# for real; their operations' durations are set here, so the expected times are exact anywhere.

STEPS = """
def skyline_iteration_provider(model):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    def iteration(x):
        optimizer.zero_grad()
        model(x).sum().backward()  # MODEL
        optimizer.step()
    return iteration
"""
# Every other iteration runs one operation more: the recorded iterations differ.
ALTERNATING_STEPS = STEPS.replace(
    "    def iteration(x):\n",
    "    calls = [0]\n    def iteration(x):\n        calls[0] += 1\n        if calls[0] % 2:\n"
    "            x = x * 1.0  # SOMETIMES\n",
)
NO_SCALING = 1e9  # a measured iteration far longer than the operations: their times are kept


def broken_down_with(
    result: Recorded, durations_of_iteration, gaps_of_iteration=None, run_time_ms: float = NO_SCALING
) -> Breakdown:
    """The breakdown, each operation's duration set by `durations_of_iteration(index, op)`; with
    `gaps_of_iteration`, the Python before it too; without, the gaps unmeasured (as on a GPU:
    nothing is scaled up to a longer iteration)."""
    for index, ops in enumerate(result.recording.iterations()):
        for op in ops:
            op.duration_ms = durations_of_iteration(index, op)
            if gaps_of_iteration is not None:
                op.gap_before_ms = gaps_of_iteration(index, op)
    if gaps_of_iteration is None:
        result.recording.wall_ns = 0
    return result.iterations.breakdown(run_time_ms, result.memory.peak_bytes)


def test_each_operation_takes_its_fastest_time_when_the_iterations_ran_the_same_operations(tmp_path):
    result = recorded(tmp_path, STEPS, iterations=3)
    first = result.recording.iterations()[0]
    # The first recorded iteration slow throughout (5 ms an operation), the others 2 and 1 ms.
    breakdown = broken_down_with(result, lambda index, op: (5.0, 2.0, 1.0)[index])
    assert breakdown.attribution.operations_ms == pytest.approx(1.0 * len(first))
    at_line = marked(first, tmp_path, "MODEL")
    forward = sum(1 for op in at_line if op.phase == FORWARD)
    backward = sum(1 for op in at_line if op.phase == BACKWARD)
    assert forward and backward
    (line,) = [entry for entry in breakdown.lines if entry.line == at_line[0].context[1]]
    assert (line.forward_ms, line.backward_ms) == (pytest.approx(1.0 * forward), pytest.approx(1.0 * backward))


@pytest.mark.parametrize("waited_in", [{2}, {0, 2}])  # one iteration, or all but one (a median keeps that)
def test_an_operation_that_waited_for_a_cpu_keeps_its_unimpeded_time(tmp_path, waited_in):
    result = recorded(tmp_path, STEPS, iterations=3)
    waiting = [result.recording.iterations()[index][0] for index in waited_in]
    breakdown = broken_down_with(result, lambda index, op: 100.0 if any(op is w for w in waiting) else 1.0)
    assert breakdown.attribution.operations_ms == pytest.approx(1.0 * len(result.recording.iterations()[0]))


# An operation that spends 20 ms off the CPU, as one that waited for a core does: an operator of
# the test's own (a namespace per test, which torch registers once per process).
NAPS = """
import time
import uuid

_library = torch.library.Library(f"skyline_naps_{uuid.uuid4().hex}", "DEF")
_library.define("nap(Tensor x) -> Tensor")


def _nap(x):
    time.sleep(0.02)
    return x.clone()


_library.impl("nap", _nap, "CPU")
nap = getattr(torch.ops, _library.ns).nap
""" + STEPS.replace("        model(x).sum().backward()  # MODEL\n", "        model(nap(x)).sum().backward()  # NAP\n")


@pytest.mark.parametrize("busy", [False, True])
def test_on_a_busy_cpu_an_operation_takes_its_threads_cpu_time_not_its_wait(tmp_path, busy):
    result = recorded(tmp_path, NAPS, iterations=2, busy=busy)
    naps = [op for ops in result.recording.iterations() for op in marked(ops, tmp_path, "NAP") if op.name == "nap"]
    assert len(naps) == 2 and all(op.duration_ms >= 20.0 and op.cpu_ms < 5.0 for op in naps)
    assert all(0 <= op.cpu_ms <= op.duration_ms for op in result.recording.operations)
    result.recording.wall_ns = 0  # the Python between operations aside: nothing scaled
    breakdown = result.iterations.breakdown(NO_SCALING, result.memory.peak_bytes)
    (line,) = [entry for entry in breakdown.lines if entry.line == naps[0].context[1]]
    if busy:  # the line's operations at their CPU time: the nap's wait left out
        assert breakdown.attribution.device_time == "thread_cpu"
        assert line.forward_ms < 10.0
    else:  # at their wall time
        assert breakdown.attribution.device_time is None
        assert line.forward_ms >= 20.0


def test_a_collective_keeps_its_wall_time(tmp_path):
    # Its time is a wait for other processes, which no CPU time shows: a one-process gloo group.
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        loop = STEPS.replace(
            "        optimizer.step()\n",
            "        torch.distributed.all_reduce(x)  # COLLECTIVE\n        optimizer.step()\n",
        )
        result = recorded(tmp_path, loop, iterations=2, busy=True)
    finally:
        dist.destroy_process_group()
    collectives = [op for ops in result.recording.iterations() for op in marked(ops, tmp_path, "COLLECTIVE")]
    assert collectives and all(op.cpu_ms is None for op in collectives)
    waiting = {id(op) for op in collectives}
    assert all(op.cpu_ms is not None for op in result.recording.operations if id(op) not in waiting)


def test_iterations_that_ran_different_operations_keep_their_mean(tmp_path):
    result = recorded(tmp_path, ALTERNATING_STEPS, iterations=3)
    iterations = result.recording.iterations()
    assert [bool(marked(ops, tmp_path, "SOMETIMES")) for ops in iterations] == [True, False, True]
    breakdown = broken_down_with(result, lambda index, op: (5.0, 1.0, 2.0)[index])
    total = sum(duration * len(ops) for duration, ops in zip((5.0, 1.0, 2.0), iterations))
    assert breakdown.attribution.operations_ms == pytest.approx(total / 3)
    sometimes = marked(iterations[0], tmp_path, "SOMETIMES")[0].context[1]
    (line,) = [entry for entry in breakdown.lines if entry.line == sometimes]
    assert line.forward_ms == pytest.approx((5.0 + 2.0) / 3)  # run twice in three iterations


SLEEPS = STEPS.replace(
    "        model(x).sum().backward()  # MODEL\n",
    "        y = model(x).sum()\n        time.sleep(0.02)\n        y.backward()  # AFTER_SLEEP\n",
)


class FakeClock:
    """The recorder's clock, injected: 1 µs passes at each reading, and what `sleep` says."""

    def __init__(self) -> None:
        self.now_ns = 0

    def __call__(self) -> int:
        self.now_ns += 1_000
        return self.now_ns

    def sleep(self, seconds: float) -> None:
        self.now_ns += round(seconds * 1e9)


def test_the_python_before_each_operation_is_recorded_apart_from_the_recorders_own_work(tmp_path, monkeypatch):
    # The user's code sleeps 20 ms before backward; the recorder's module hook takes 30 ms (both on
    # an injected clock, so the figures are exact anywhere).
    clock = FakeClock()
    monkeypatch.setattr(recorder_module, "perf_counter_ns", clock)
    monkeypatch.setattr(time, "sleep", clock.sleep)
    innermost = CallSites.innermost

    def slow_hook_work(self, skip=1):
        clock.sleep(0.03)
        return innermost(self, skip + 1)

    monkeypatch.setattr(CallSites, "innermost", slow_hook_work)
    result = recorded(tmp_path, "import time\n" + SLEEPS, iterations=2)
    for ops in result.recording.iterations():
        after_sleep = marked(ops, tmp_path, "AFTER_SLEEP")[0]
        assert 20.0 <= after_sleep.gap_before_ms < 20.1  # the sleep, and the clock's readings
        in_the_model = [op for op in ops if op.module == "model"]
        assert in_the_model and all(op.gap_before_ms < 0.1 for op in in_the_model)  # not the hook's 30 ms
    breakdown = result.iterations.breakdown(NO_SCALING, result.memory.peak_bytes)
    assert 20.0 <= breakdown.attribution.between_operations_ms < 21.0


def test_a_longer_measured_iteration_is_shared_out_over_the_operations_and_the_python_between_them(tmp_path):
    # A busy machine: each operation 1 ms at its fastest with 0.5 ms of Python before it (in the
    # second iteration, 50 ms: it waited), and the measured iteration 4 times as long as both.
    result = recorded(tmp_path, STEPS, iterations=3)
    first = result.recording.iterations()[0]
    ops = len(first)
    unimpeded = 1.5 * ops
    breakdown = broken_down_with(
        result, lambda index, op: 1.0, lambda index, op: 50.0 if index == 1 else 0.5, run_time_ms=4 * unimpeded
    )
    attribution = breakdown.attribution
    assert attribution.between_operations_ms == pytest.approx(0.5 * ops)
    assert attribution.scaled_by == pytest.approx(4.0) and attribution.operations_ms == pytest.approx(4.0 * ops)
    at_line = marked(first, tmp_path, "MODEL")
    (line,) = [entry for entry in breakdown.lines if entry.line == at_line[0].context[1]]
    assert line.forward_ms + line.backward_ms == pytest.approx(4.0 * len(at_line))
    # Its share is its share of the unimpeded iteration; the parts add up to the measured one.
    assert (line.forward_ms + line.backward_ms) / (4 * unimpeded) == pytest.approx(len(at_line) / unimpeded)
    assert attribution.user_lines_ms + breakdown.untracked.run_time_ms == pytest.approx(4 * unimpeded)
    # Fitted to the iteration timed again: as if built there. Twice as long: scaled by 2.
    again = breakdown.fitted_to(2 * unimpeded)
    (line,) = [entry for entry in again.lines if entry.line == at_line[0].context[1]]
    assert again.attribution.scaled_by == pytest.approx(2.0)
    assert line.forward_ms + line.backward_ms == pytest.approx(2.0 * len(at_line))
    # A quiet machine's iteration leaves less beside the operations than the recorded gaps (the
    # recorder's own work lengthens them): nothing is scaled; shorter than the operations: down.
    quiet = breakdown.fitted_to(1.2 * ops)
    assert quiet.attribution.scaled_by == pytest.approx(1.0)
    assert quiet.attribution.user_lines_ms + quiet.untracked.run_time_ms == pytest.approx(1.2 * ops)
    assert breakdown.fitted_to(0.5 * ops).attribution.scaled_by == pytest.approx(0.5)


@pytest.mark.parametrize(
    "run_time_ms, iterations",
    [
        (0.5, 5),  # fast: up to the most, within the budget for fast ones
        (50.0, 4),
        (700.0, 3),  # slow: the minimum all the same (it was one)
        (4_000.0, 2),  # only two fit the limit
        (20_000.0, 1),
    ],
)
def test_slow_iterations_are_recorded_at_least_three_times(run_time_ms, iterations):
    assert recorded_iterations(run_time_ms) == iterations


@pytest.mark.parametrize(
    "run_time_ms, iterations",
    [
        (0.5, 15),
        (500.0, 15),
        (1_300.0, 15),  # a small GPT's iteration under two busy processes
        (1_500.0, 13),  # as many as fit the limit
        (4_000.0, 5),
        (30_000.0, 1),
    ],
)
def test_a_busy_machine_records_up_to_fifteen_iterations(run_time_ms, iterations):
    assert recorded_iterations(run_time_ms, busy=True) == iterations
