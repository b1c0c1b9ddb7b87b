"""The user's training iteration, built once from the entry point, and its measurement at one
batch size: time and peak memory.

`IterationRunner` builds the model and the iteration function from the providers, then offers the
steps of a measurement separately, so that the analysis can interleave them with recording the
breakdown (`attribute/`): `at_batch_size(s)` (the inputs, and what an out-of-memory becomes), `warm_up`,
`memory`, `time` (one batch size) or `timing` (several, interleaved), `check_trained`. `measure`
chains them for one batch size; `memory_at` measures memory alone.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import inspect
import math
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from time import perf_counter  # bound now: user code may replace time's (freezegun)
from typing import Any, Callable, cast

import torch
from torch.utils.hooks import RemovableHandle

from skyline_engine.entry.contract import INPUT_PROVIDER, ITERATION_PROVIDER, MODEL_PROVIDER
from skyline_engine.entry.loader import EntryPoint, user_code_error
from skyline_engine.entry.user_frames import innermost_user_frame
from skyline_engine.errors import EntryPointError, UserCodeError
from skyline_engine.measure import saved_tensors
from skyline_engine.measure.allocator import pin_malloc_thresholds
from skyline_engine.measure.compilation import (
    COMPILED_PROGRAM_PEAK,
    EAGER_REPLAY_PEAK,
    NOTHING_COMPILED,
    Compilation,
    CompilerWork,
    compiler_work,
    quiet_about_global_hooks,
)
from skyline_engine.measure.debug_modes import anomaly_detection_note
from skyline_engine.measure.distributed import unused_parameters_advice
from skyline_engine.measure.held_modules import modules_held_by
from skyline_engine.measure.inputs import MAX_INPUTS, InputShapesSeen, bounded_inputs
from skyline_engine.measure.memory import (
    LiveTensors,
    MemoryProfile,
    is_out_of_memory,
    measure_memory,
    measure_program_memory,
    release_cached_memory,
)
from skyline_engine.measure.optimizer_state import StepsSeen, counting_steps
from skyline_engine.measure.runtime import asked_to_settle
from skyline_engine.measure.timing import (
    Clock,
    InterleavedTiming,
    TimingBudget,
    TimingStats,
    clock_for,
    measure_iteration_time,
)
from skyline_engine.measure.work_per_call import CallWork, WorkPerCall, cycle_fits, find_cycle

Run = Callable[[], None]

# Warming up until an optimizer steps (a GradScaler skipping its first steps) stops after this
# many iterations or seconds: a GradScaler halves its scale at each skip, so 64 cover any start;
# so does warming up until the optimizers' state settles (LBFGS: 5 to 100 steps).
STEADY_STATE_ITERATIONS = 64
STEADY_STATE_S = 10.0
# The optimizers' state has settled when this many calls in a row leave it as large as it was: on
# a new batch each call, LBFGS skips the update of a step whose curvature is not positive (no
# history entry), and one such step had ended the warm-up before the history was full.
SETTLED_CALLS = 3


class GradientCount:
    """Gradients accumulated into a model's parameters, by parameter (`counting_gradients`)."""

    def __init__(self) -> None:
        self.by_parameter: collections.Counter[int] = collections.Counter()

    @property
    def count(self) -> int:
        """All of them."""
        return sum(self.by_parameter.values())

    @property
    def backward_passes(self) -> int:
        """The backward passes that reached the model: the most any one parameter accumulated (a
        parameter a pass does not reach would make a total undercount them)."""
        return max(self.by_parameter.values(), default=0)


def after_accumulation(parameter: torch.Tensor, hook: Callable[[torch.Tensor], None]) -> RemovableHandle:
    """`hook(parameter)` after each gradient accumulated into it (a backward pass that reached it)."""
    # Named through torch.Tensor so that tests/test_torch_apis.py checks it exists in the torch installed.
    # torch leaves it unannotated; its documented signature:
    register = cast(
        Callable[[torch.Tensor, Callable[[torch.Tensor], None]], RemovableHandle],
        torch.Tensor.register_post_accumulate_grad_hook,
    )
    return register(parameter, hook)


@contextlib.contextmanager
def counting_gradients(model: torch.nn.Module) -> Iterator[GradientCount]:
    """How many gradients were accumulated into the model's parameters meanwhile (a backward pass
    that reached them), by parameter."""
    gradients = GradientCount()

    def counting(index: int) -> Callable[[torch.Tensor], None]:
        return lambda _: gradients.by_parameter.update((index,))

    handles = [after_accumulation(p, counting(i)) for i, p in enumerate(model.parameters()) if p.requires_grad]
    try:
        yield gradients
    finally:
        for handle in handles:
            handle.remove()


class OutOfMemoryAtBatchSize(Exception):
    """The iteration does not fit at `batch_size`. It keeps the cause's text and the user's line
    where the allocation failed (`path`, `line`; None when no frame of the user's code was on the
    stack), not the exception: the failed iteration's frames (and the activations they hold)
    must be freed before a smaller batch size is tried."""

    def __init__(
        self,
        batch_size: int,
        cause: BaseException,
        where: tuple[str | None, int | None],
        iterations_before: int = 0,
    ) -> None:
        # A MemoryError (Python's, or torch's under an address-space limit) often has no text.
        self.cause = str(cause) or type(cause).__name__
        super().__init__(f"out of memory at batch size {batch_size}: {self.cause}")
        self.batch_size = batch_size
        self.path, self.line = where
        # Iterations that had run at this batch size in the steady state (after the warm-up:
        # the optimizers' state made and settled): where there were any, memory that grows with
        # each one (tensors kept across iterations) ran out, not the batch size.
        self.iterations_before = iterations_before


@dataclass(frozen=True)
class Sample:
    """One batch size, measured: the iteration's time and its memory."""

    batch_size: int
    timing: TimingStats
    memory: MemoryProfile
    # Gradient accumulation: the iteration runs this many micro-batches of `batch_size` samples
    # before its optimizer step (attribute/recorder.py, Recording.micro_batches).
    micro_batches: int = 1

    @property
    def peak_memory_bytes(self) -> int:
        return self.memory.peak_bytes

    @property
    def run_time_ms(self) -> float:
        return self.timing.run_time_ms

    @property
    def samples_per_second(self) -> float:
        return self.micro_batches * self.batch_size / self.run_time_ms * 1000.0

    def to_dict(self) -> dict[str, Any]:
        """A measurement as the analysis document writes it (`iteration`, `models.samples[]`,
        `predictions[].measured`)."""
        return {
            "batch_size": self.batch_size,
            "run_time_ms": self.run_time_ms,
            "run_time_iqr_ms": self.timing.iqr_ms,
            "repetitions": self.timing.iterations,
            "samples_per_second": self.samples_per_second,
            "micro_batches": self.micro_batches,
            "peak_memory_bytes": self.peak_memory_bytes,
            "peak_memory_phase": self.memory.peak_phase,
            "peak_memory_reserved_bytes": self.memory.reserved_peak_bytes,
            "page_faults_per_iteration": self.timing.page_faults,
        }


def single_iteration_timing(*upper_bounds_ms: float) -> TimingStats:
    """The time of an iteration before it is timed, from single iterations that each over-estimate
    it (a warm-up may carry one-off costs, a recorded one the recorder's): the lowest of them."""
    return TimingStats(min(upper_bounds_ms), 0.0, 1, 1, relative_error=math.inf)


_TUPLE_HINT = "Wrap the inputs in a tuple, e.g. `return (images, labels)` or `return (x,)`."
# A Hugging Face batch is a dict the model takes by keyword: one input, unpacked in the iteration.
_DICT_HINT = " For a dict of inputs, return `(batch,)` and call `model(**batch)` in the iteration."


class IterationRunner:
    """Builds the user's model and iteration once, then measures them at any batch size.

    Use it inside `with runner:`; see `__enter__`."""

    def __init__(
        self,
        entry: EntryPoint,
        device: torch.device,
        budget: TimingBudget,
        wrap_model: Callable[[torch.nn.Module], torch.nn.Module] | None = None,
        find_steady_state: bool = True,
    ) -> None:
        """`wrap_model` turns the provider's model into the one the iteration provider gets (DDP).
        `find_steady_state`: warm up until an optimizer steps (False where every iteration must run
        in lockstep with other processes: how long to wait is decided locally)."""
        if device.type == "cuda":
            if device.index is None:  # plain `cuda` is the current device (set_device needs an index)
                device = torch.device("cuda", torch.cuda.current_device())
            # CUDA events record on the current device's stream, and `with torch.device(...)` does
            # not change the current device: without this, `cuda:1` would be timed on cuda:0.
            torch.cuda.set_device(device)
        self.entry = entry
        self.device = device
        self.budget = budget
        self.clock: Clock = clock_for(device)
        # Before the model's memory is allocated, where the runtime is to be settled (measure/runtime.py).
        self.malloc_pinned = asked_to_settle(os.environ) and pin_malloc_thresholds()
        quiet_about_global_hooks()
        with self._default_device():
            self.model = entry.call(MODEL_PROVIDER, entry.model_provider)
            _check_model(self.model, entry)
            if wrap_model is not None:
                self.model = wrap_model(self.model)
            self.iteration = entry.call(ITERATION_PROVIDER, entry.iteration_provider, self.model)
        if not callable(self.iteration):
            raise EntryPointError(
                f"`{ITERATION_PROVIDER}` returned {_describe(self.iteration)}, not a function.",
                path=entry.relative_path,
                line=entry.line_of(entry.iteration_provider),
                hint="Return the function that runs one training iteration: `return iteration`.",
            )
        # Modules the iteration keeps beside the model (an EMA copy): their updates are update work.
        self.held_modules = modules_held_by(self.iteration, self.model)
        self._last_output: Any = None
        self.model.register_forward_hook(self._remember_output)
        self._ran_at: set[int] = set()  # the batch sizes the iteration ran at without an error
        saved_tensors.allow()  # until this analysis's iteration refuses them (see warm_up)
        self._compiled: dict[int, CompilerWork] = {}  # by batch size, in the order they first compiled
        # Steady state reached (an optimizer stepped: its state exists), or sought and said to be out of reach.
        self._steady = not find_steady_state
        self.notes: list[str] = []  # what the user should know about how the iteration was measured
        self._steps = StepsSeen()  # optimizer steps while measuring (`with runner:`)
        self._calls = 0  # of the iteration, all told
        # Calls that returned in the steady state (after the warm-up), by batch size.
        self._completed: collections.Counter[int] = collections.Counter()
        self._forwards = 0  # passes through the model (`_remember_output`)
        self._anomaly_detection = False  # seen on while the iteration ran (measure/debug_modes.py)
        self._told_of_anomaly_detection = False
        self._work: dict[int, WorkPerCall] = collections.defaultdict(WorkPerCall)  # by batch size, steady
        # Calls that differ in a cycle of this many (`measure_in_cycles`): memory and time are
        # measured over whole cycles, the first starting after call number `_cycle_end`.
        self.cycle = 1
        self._cycle_end = 0
        self.live_tensors = LiveTensors()
        self._input_shapes = InputShapesSeen()
        self._frozen = contextlib.ExitStack()

    def __enter__(self) -> IterationRunner:
        """Measure inside `with runner:`: what is alive now (torch, the engine, the model) is frozen
        for the garbage collector while measuring, so each memory measurement scans only what was
        created since, and collections during timed iterations do not walk the engine's objects
        (see LiveTensors)."""
        self._frozen.enter_context(self.live_tensors.frozen())
        self._steps = self._frozen.enter_context(counting_steps())
        return self

    def __exit__(self, *exc: object) -> None:
        self._frozen.close()

    # -- one batch size, step by step ---------------------------------------------------------------

    @contextlib.contextmanager
    def at_batch_sizes(self, batch_sizes: Sequence[int]) -> Iterator[dict[int, Run]]:
        """The iteration at each of `batch_sizes`, ready to run (the inputs made once each). An
        iteration, or its inputs, that run out of memory raise OutOfMemoryAtBatchSize naming their
        batch size; inputs of the same shapes as another batch size's raise InputsIgnoreBatchSize
        (measure/inputs.py) before their iteration runs; whatever happens, the inputs and what the
        iterations left are released afterwards."""
        inputs: dict[int, Sequence[Any]] = {}
        try:
            for batch_size in batch_sizes:
                inputs[batch_size] = self._inputs_that_fit(batch_size)
            yield {b: functools.partial(self._call_iteration, x, b) for b, x in inputs.items()}
        finally:
            inputs.clear()
            self._last_output = None
            release_cached_memory(self.device)

    @contextlib.contextmanager
    def at_batch_size(self, batch_size: int) -> Iterator[Run]:
        """`at_batch_sizes` for one batch size."""
        with self.at_batch_sizes([batch_size]) as runs:
            yield runs[batch_size]

    def warm_up(self, run: Run) -> float:
        """The warm-up iterations; the time of the last one (infinite when none ran).

        Skyline's observation: optimizers such as Adam create their state in the first step, so
        memory is measured after a warm-up (steady state). Later batch sizes need none on CPU (the
        state exists, nothing is tuned per shape, and the memory iteration comes before timing);
        cuDNN picks its algorithms per shape, so CUDA warms up at every batch size, and torch.compile
        compiles for new shapes, so a compiled model does too."""
        if self._ran_at and self.device.type != "cuda" and not self._compiled:
            return math.inf
        first = not self._ran_at
        with counting_steps() as steps:
            if first:
                last_ms = self.clock.time_ms(lambda: self._first_run_under_saved_tensor_hooks(run))
            for _ in range(self.budget.warmup_iterations - 1):
                run()
            # Read only while steady state is sought: a walk of every optimizer's state.
            state_bytes = self._steps.state_bytes() if not self._steady else 0
            if not (first and self._steady_after_first_run(steps)):
                last_ms = self.clock.time_ms(run)
        if not self._steady:
            self._steady = steps.count > 0 or self._until_an_optimizer_steps(run)
            if self._steps.state_bytes() != state_bytes:
                self._until_optimizer_state_settles(run)
        if self._anomaly_detection and not self._told_of_anomaly_detection:
            self._told_of_anomaly_detection = True
            self.notes.append(anomaly_detection_note(self.entry.files, self.entry.relative_path))
        return last_ms

    def _steady_after_first_run(self, steps: StepsSeen) -> bool:
        """Whether the first iteration (`steps`: the optimizer steps it ran) left the steady state,
        so that no second warm-up iteration is due to check that the optimizers' state stopped
        growing: on the CPU (CUDA tunes and loads kernels per shape in the first), where an
        optimizer stepped and every one that did makes all its state in its first step
        (measure/optimizer_state.py), and nothing is known to change after the first call: not
        compiled (torch.compile may compile again once the optimizer's state exists), no
        TorchScript module (its executor optimizes the graph it profiled in the first call), no
        data-parallel training (DDP rebuilds its gradient buckets in the second call's forward).
        The second iteration was a sixth of the small GPT's time to its first per-line result
        (0.17 of 0.71 s)."""
        return (
            self.device.type == "cpu"
            and steps.count > 0
            and steps.state_made_in_first_step()
            and not self._compiled
            and not any(isinstance(module, torch.jit.ScriptModule) for module in self.model.modules())
            and not (torch.distributed.is_available() and torch.distributed.is_initialized())
        )

    def _first_run_under_saved_tensor_hooks(self, run: Run) -> None:
        """The first iteration, under saved-tensor hooks that change nothing: where torch refuses
        them (torch.func's transforms), the analysis runs without (measure/saved_tensors.py)."""
        try:
            with saved_tensors.unchanged():
                run()
        except UserCodeError as error:
            if not saved_tensors.refuse(error):
                raise
            self.notes.append(
                "torch.func's transforms (grad, vjp, jacrev) refuse autograd's saved-tensor hooks, through which "
                "Skyline counts the activations each line keeps for the backward pass: the lines' memory leaves "
                "them out (they count as untracked)."
            )

    def _until_an_optimizer_steps(self, run: Run) -> bool:
        """Steady state needs the optimizer's state, made by its first step; a GradScaler skips the
        step while the scaled gradients overflow (its first steps, with a large `init_scale`). So
        warm up until an optimizer steps, within STEADY_STATE_ITERATIONS and STEADY_STATE_S, and
        say when none did. An iteration whose backward pass reaches none of the model's parameters
        (inference, evaluation) has nothing to step, and one that updates its parameters itself
        (`p -= lr * p.grad`) has no optimizer state: either is in steady state at once, unwarned.
        True either way: there is nothing more to wait for."""
        started = perf_counter()
        ran = self.budget.warmup_iterations
        # The first of these iterations decides whether gradients reach the parameters at all.
        with counting_gradients(self.model) as gradients:
            while ran < STEADY_STATE_ITERATIONS and perf_counter() - started < STEADY_STATE_S:
                before = _parameter_versions(self.model)
                with counting_steps() as steps:
                    run()
                ran += 1
                if steps.count or not gradients.count or _parameter_versions(self.model) != before:
                    return True
        self.notes.append(
            f"No optimizer stepped in {ran} warm-up iterations. If your iteration steps one, through a "
            "GradScaler say (it skips optimizer.step() while the scaled gradients overflow), it did not "
            "reach a steady state: the optimizer's step and its state are missing from the time and memory "
            "measured. Start the scaler lower (init_scale), or run enough iterations in the iteration "
            "provider before returning the iteration."
        )
        return True

    def _until_optimizer_state_settles(self, run: Run) -> None:
        """Steady state needs optimizer state that has stopped growing (LBFGS's history of updates,
        measure/optimizer_state.py): run until SETTLED_CALLS calls in a row leave it as large as it
        was and no history of a set length is still filling, within STEADY_STATE_ITERATIONS and
        STEADY_STATE_S. Where it does not settle, the
        retention check after the timing finds the growth, and says so."""
        started = perf_counter()
        state_bytes = self._steps.state_bytes()
        unchanged = 0
        for _ in range(STEADY_STATE_ITERATIONS):
            if perf_counter() - started >= STEADY_STATE_S:
                return
            run()
            before, state_bytes = state_bytes, self._steps.state_bytes()
            unchanged = unchanged + 1 if state_bytes == before else 0
            if unchanged >= SETTLED_CALLS and not self._steps.history_filling():
                return

    def work_at(self, batch_size: int) -> WorkPerCall:
        """What the calls at `batch_size` did, in steady state (measure/work_per_call.py)."""
        return self._work[batch_size]

    def passes_per_call(self, batch_size: int) -> int | None:
        """How many times most calls at `batch_size` ran the model; None before any steady call."""
        usual = self.work_at(batch_size).usual()
        return usual.forwards if usual is not None else None

    def model_calls_grow_with_batch_size(self) -> bool:
        """Whether calls usually ran the model more times at larger batch sizes: a loop that
        splits its batch into chunks of a fixed size, not one that accumulates micro-batches of
        `batch_size` samples each (a fixed number of them, or fewer at larger batch sizes for a
        fixed number of samples per step)."""
        usual = [work.forwards for _, calls in sorted(self._work.items()) if (work := calls.usual()) is not None]
        return len(usual) > 1 and usual[-1] > usual[0] and usual == sorted(usual)

    def cycle_of_calls(self, run: Run, batch_size: int, run_time_ms: float) -> int:
        """How many calls make one cycle where the iteration's calls at `batch_size` (`run`'s)
        differ (1 where they do not, or not in a cycle), running a few more calls (within
        CYCLE_BUDGET_MS, at `run_time_ms` each) where those seen so far do not tell."""
        return find_cycle(self.work_at(batch_size), run, run_time_ms)

    def measure_in_cycles(self, calls: int, batch_size: int, run_time_ms: float) -> bool:
        """Where the iteration's calls differ in a cycle of `calls`, as found at `batch_size`
        (measure/work_per_call.py), and one cycle of calls of `run_time_ms` each fits
        CYCLE_BUDGET_MS: from now on, memory is measured over one whole cycle starting where a
        cycle starts, so that every batch size's peak is that of the same calls, and time in
        blocks of whole cycles; whether it is. Where a cycle starts is counted in calls, whatever
        their batch size: the iteration's own count of its calls goes on from one batch size to
        the next."""
        if not cycle_fits(calls, run_time_ms):
            return False
        self.cycle = calls
        self._cycle_end = self.work_at(batch_size).last_cycle_end() or self._calls
        return True

    def align_to_cycle(self, run: Run) -> None:
        """Calls until the next one starts a cycle (none where calls do not differ)."""
        while self.cycle > 1 and (self._calls - self._cycle_end) % self.cycle:
            run()

    def memory(self, run: Run) -> MemoryProfile:
        """The tensor memory of one iteration, operation by operation (of one whole cycle of calls,
        where calls differ: see `measure_in_cycles`); phase by phase for a compiled model on CUDA
        (`measures_program_memory`)."""
        measure = self._program_memory if self.measures_program_memory else self._replayed_memory
        if self.cycle == 1:
            return measure(run)
        self.align_to_cycle(run)
        cycle = self.cycle

        def whole_cycle() -> None:
            for _ in range(cycle):
                run()

        return measure(whole_cycle)

    @property
    def measures_program_memory(self) -> bool:
        """A compiled model on CUDA: its memory is its own program's (`measure_program_memory`),
        not the eager replay's (read after the warm-up, which compiles it)."""
        return self.device.type == "cuda" and bool(self._compiled)

    def _program_memory(self, run: Run) -> MemoryProfile:
        return measure_program_memory(self.device, run)

    def _replayed_memory(self, run: Run) -> MemoryProfile:
        return measure_memory(self.device, run, self.live_tensors)

    def time(self, run: Run, batch_size: int) -> TimingStats:
        """The iteration timed until the estimate is stable, in blocks of whole cycles where calls
        differ (`measure_in_cycles`); its loss and parameters checked finite before and after."""
        self.check_finite(batch_size)
        timing = measure_iteration_time(run, self.clock, self.budget, cycle=self.cycle)
        self.check_trained(batch_size)
        return timing

    def timing(self, runs: Mapping[int, Run]) -> InterleavedTiming:
        """Timing for several batch sizes at once, in interleaved rounds (see measure/timing.py);
        call `check_trained` after it."""
        return InterleavedTiming(runs, self.clock, self.budget, cycle=self.cycle)

    def memory_at(self, batch_size: int) -> MemoryProfile:
        """The memory of one iteration at `batch_size`, untimed (after a warm-up where one is
        due); OutOfMemoryAtBatchSize when it does not fit."""
        with self.at_batch_size(batch_size) as run:
            self.warm_up(run)
            return self.memory(run)

    def warm_up_at(self, batch_size: int) -> None:
        """The warm-up `memory_at` runs, without the memory: for a batch size whose memory is
        known already (analysis/known_memory.py). None is due on the CPU, where this only makes
        the inputs (out of memory there raises as `memory_at` would)."""
        with self.at_batch_size(batch_size) as run:
            self.warm_up(run)

    def measure(self, batch_size: int) -> Sample:
        """Time and peak memory at `batch_size`; OutOfMemoryAtBatchSize when it does not fit."""
        with self.at_batch_size(batch_size) as run:
            self.warm_up(run)
            memory = self.memory(run)
            timing = self.time(run, batch_size)
        return Sample(batch_size, timing, memory)

    # -- the user's code ------------------------------------------------------------------------------

    def _inputs_that_fit(self, batch_size: int) -> Sequence[Any]:
        out_of_memory = None
        try:
            return self._inputs(batch_size)
        except (UserCodeError, MemoryError, RuntimeError) as exc:
            cause = exc.__cause__ if isinstance(exc, UserCodeError) and exc.__cause__ is not None else exc
            if not is_out_of_memory(cause):
                raise
            # Raised below, outside this handler: raised here it would keep `exc` (and through its
            # traceback the tensors made so far) alive as its __context__.
            where = (exc.path, exc.line) if isinstance(exc, UserCodeError) else self._user_line(exc)
            out_of_memory = OutOfMemoryAtBatchSize(batch_size, cause, where)
        raise out_of_memory

    def _inputs(self, batch_size: int) -> Sequence[Any]:
        entry = self.entry
        with self._default_device():
            inputs = entry.call(INPUT_PROVIDER, entry.input_provider, batch_size=batch_size)
        if isinstance(inputs, (torch.Tensor, str, bytes, dict)) or not _is_iterable(inputs):
            raise EntryPointError(
                f"`{INPUT_PROVIDER}` returned {_describe(inputs)}; it must return a tuple of the "
                "iteration's inputs, which Skyline passes as `iteration(*inputs)`.",
                path=entry.relative_path,
                line=entry.line_of(entry.input_provider),
                hint=_TUPLE_HINT + (_DICT_HINT if isinstance(inputs, dict) else ""),
            )
        taken = bounded_inputs(inputs)
        path, line = entry.relative_path, entry.line_of(entry.input_provider)
        if taken is None:
            raise EntryPointError(
                f"`{INPUT_PROVIDER}` returned more than {MAX_INPUTS:,} inputs: a generator that does not end? It "
                "must return the iteration's inputs, which Skyline passes as `iteration(*inputs)`.",
                path=path,
                line=line,
                hint=_TUPLE_HINT,
            )
        inputs = taken
        self._input_shapes.check(batch_size, inputs)
        empty = self._input_shapes.sampleless(batch_size)
        if empty is not None:
            raise EntryPointError(
                f"`{INPUT_PROVIDER}` made an input with no samples at your batch size {batch_size} (shape "
                f"{tuple(empty)}): the iteration would train on nothing, and its speed would be no one's.",
                path=path,
                line=line,
                hint="Make the inputs' first dimension the batch size, e.g. `torch.randn(batch_size, 8)`.",
            )
        emptied = self._input_shapes.emptied(batch_size)
        if emptied is not None:
            message = (
                f"`{INPUT_PROVIDER}` made an empty input at batch size {emptied.batch_size} (shape "
                f"{tuple(emptied.shape)}; at batch size {emptied.other}: {tuple(emptied.other_shape)}), so the "
                "iteration would train on nothing there: a batch size your code does not support, as when it makes "
                "`N // batch_size` micro-batches and the batch size exceeds N."
            )
            if emptied.batch_size != batch_size:
                # One measured before this one: the user's own, the first. Nothing it measured holds.
                raise EntryPointError(message, path=path, line=line)
            error = UserCodeError(message, path=path, line=line)
            error.batch_size = batch_size  # a probe's: a batch size left out, not the analysis's end
            raise error
        return inputs

    @property
    def compilation(self) -> Compilation | None:
        """What torch.compile compiled while the iteration ran; None when it compiled nothing."""
        if not self._compiled:
            return None
        peak = COMPILED_PROGRAM_PEAK if self.measures_program_memory else EAGER_REPLAY_PEAK
        return Compilation(tuple(self._compiled.items()), peak)

    def _call_iteration(self, inputs: Sequence[Any], batch_size: int) -> None:
        out_of_memory = None
        before, steps_before, forwards_before = compiler_work(), self._steps.count, self._forwards
        self._calls += 1
        # Switched on for the whole process (the forward hook sees it switched on around the model).
        self._anomaly_detection = self._anomaly_detection or torch.is_anomaly_enabled()
        try:
            self.iteration(*inputs)
        except (Exception, SystemExit) as exc:  # sys.exit() would end Skyline silently
            if not is_out_of_memory(exc):
                raise self._iteration_error(exc, batch_size) from exc
            # Raised below, outside this handler: raised here it would keep `exc`, and through its
            # traceback the failed iteration's tensors, alive (CUDA could free nothing).
            ran = self._completed[batch_size]
            out_of_memory = OutOfMemoryAtBatchSize(batch_size, exc, self._user_line(exc), ran)
        finally:
            self._note_compiled(batch_size, compiler_work() - before)
        if out_of_memory is not None:
            raise out_of_memory
        self._ran_at.add(batch_size)
        if self._steady:
            self._completed[batch_size] += 1
            work = CallWork(self._steps.count - steps_before, self._forwards - forwards_before)
            self._work[batch_size].add(work, self._calls)

    def _note_compiled(self, batch_size: int, work: CompilerWork) -> None:
        if work != NOTHING_COMPILED:
            self._compiled[batch_size] = self._compiled.get(batch_size, NOTHING_COMPILED) + work

    def _user_line(self, exc: BaseException) -> tuple[str | None, int | None]:
        frame = innermost_user_frame(exc.__traceback__, self.entry.files)
        return (self.entry.files.relative(frame.filename), frame.lineno) if frame else (None, None)

    def _iteration_error(self, exc: BaseException, batch_size: int) -> UserCodeError:
        where = f"the training iteration at batch size {batch_size}"
        others = sorted(self._ran_at - {batch_size})
        if others:
            where += f", after it had run at batch size{'s' if len(others) > 1 else ''} {', '.join(map(str, others))}"
        error = user_code_error(self.entry.files, where, exc, fallback=self.iteration, advice=self._advice(exc))
        error.batch_size = batch_size
        if isinstance(exc, TypeError) and innermost_user_frame(exc.__traceback__, self.entry.files) is None:
            # It failed before running a line of the user's: the inputs do not match its parameters.
            error.hint = f"Skyline calls it as `iteration(*inputs)` with what `{INPUT_PROVIDER}` returns."
        return error

    def _advice(self, exc: BaseException) -> str | None:
        """What to do about the iteration's error, where the runner knows more than the exception."""
        if isinstance(exc, StopIteration):
            # Data read inside the iteration (`next(batches)`) from a loader of a few dozen batches.
            return (
                f"An iterator your iteration reads from ran out, at its call number {self._calls:,}: Skyline runs "
                "the iteration hundreds of times (warm-up, timing, recording, at several batch sizes). Make the "
                f"batch in `{INPUT_PROVIDER}`, which Skyline passes to every call, or loop over the data "
                "(itertools.cycle)."
            )
        return unused_parameters_advice(exc, self.model)

    def _remember_output(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        # A loss alone, one number, detached: the whole output (a language model's logits) kept
        # here stayed alive through backward and into the next iteration's forward pass, in every
        # peak measured (a classifier's 1 MiB of logits in a 4.3 MiB peak; training frees them once
        # the cross-entropy has run). Detached beneath the dispatch modes, which would record it.
        self._last_output = None
        if isinstance(output, torch.Tensor) and output.numel() == 1:
            with torch._C._DisableTorchDispatch():
                self._last_output = output.detach()
        self._forwards += 1
        # Inside the iteration: `with torch.autograd.detect_anomaly():` around the forward pass too.
        self._anomaly_detection = self._anomaly_detection or torch.is_anomaly_enabled()

    def check_finite(self, batch_size: int) -> None:
        """The loss of the last iteration, checked: a diverging iteration measures nothing real."""
        loss = self._last_output
        if isinstance(loss, torch.Tensor) and loss.numel() == 1 and loss.is_floating_point():
            value = float(loss.detach())
            if not math.isfinite(value):
                kind = "NaN" if math.isnan(value) else f"infinite ({value})"
                raise self._not_finite_error(f"the loss the model returned at batch size {batch_size} is {kind}")

    def check_trained(self, batch_size: int) -> None:
        """The last loss and every parameter checked finite, after training at `batch_size`."""
        self.check_finite(batch_size)
        self._check_parameters_finite(batch_size)

    def _check_parameters_finite(self, batch_size: int) -> None:
        for name, param in self.model.named_parameters():
            if param.is_floating_point() and not bool(torch.isfinite(param.detach()).all()):
                raise self._not_finite_error(
                    f"parameter `{name}` holds NaN or infinite values after training at batch size {batch_size}"
                )

    def _not_finite_error(self, what: str) -> UserCodeError:
        path, line = self._model_forward_location()
        return UserCodeError(
            f"{what}; the iteration diverges, so its measurements would not describe training.",
            path=path,
            line=line,
            hint="Check the learning rate, the inputs and the loss (a log of zero, a division by zero).",
        )

    def _model_forward_location(self) -> tuple[str | None, int | None]:
        forward = getattr(type(self.model), "forward", None)
        code = getattr(forward, "__code__", None)
        if code is not None and self.entry.files.contains(code.co_filename):
            return self.entry.files.relative(code.co_filename), code.co_firstlineno
        return self.entry.relative_path, self.entry.line_of(self.entry.model_provider)

    def _default_device(self) -> contextlib.AbstractContextManager[Any]:
        # Providers create tensors and modules on the analysis device without naming it. The
        # iteration itself runs without a default device: torch implements it as a function mode
        # that would add overhead to every operation we time.
        if self.device.type == "cpu":
            return contextlib.nullcontext()
        return self.device


def _parameter_versions(model: torch.nn.Module) -> list[int]:
    """How many times each parameter was changed in place (autograd's version counter): an update
    outside any optimizer (gradients accumulate into `.grad`, not the parameter) changes it."""
    return [p._version for p in model.parameters()]


def _check_model(model: Any, entry: EntryPoint) -> None:
    if not isinstance(model, torch.nn.Module):
        raise EntryPointError(
            f"`{MODEL_PROVIDER}` returned {_describe(model)}, not a torch.nn.Module.",
            path=entry.relative_path,
            line=entry.line_of(entry.model_provider),
            hint="Return the model, e.g. `return MyModel()`; Skyline's convention is a model that returns the loss.",
        )


def _is_iterable(value: Any) -> bool:
    try:
        iter(value)
    except TypeError:
        return False
    return True


def _describe(value: Any) -> str:
    if value is None:
        return "None"
    if isinstance(value, torch.Tensor):
        return f"a bare Tensor of shape {tuple(value.shape)}"
    if inspect.isclass(value):
        # `return MyModel` for `return MyModel()`: "a value of type type" would not say so.
        return f"the class {value.__name__} itself"
    return f"a value of type {type(value).__name__}"
