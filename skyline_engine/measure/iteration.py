"""Measuring the user's training iteration at one batch size: its time and its peak memory."""

from __future__ import annotations

import contextlib
import functools
import inspect
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Callable

import torch

from skyline_engine.attribute.breakdown import build_breakdown
from skyline_engine.attribute.creation import CreationSites
from skyline_engine.attribute.frames import CallSites
from skyline_engine.attribute.recorder import OperationRecorder
from skyline_engine.entry.contract import INPUT_PROVIDER, ITERATION_PROVIDER, MODEL_PROVIDER
from skyline_engine.entry.loader import EntryPoint, user_code_error
from skyline_engine.entry.user_frames import innermost_user_frame
from skyline_engine.errors import EntryPointError, UserCodeError
from skyline_engine.measure.allocator import pin_malloc_thresholds
from skyline_engine.measure.memory import (
    LiveTensors,
    StorageCounter,
    is_out_of_memory,
    measure_peak_bytes,
    release_cached_memory,
)
from skyline_engine.measure.timing import TimingBudget, TimingStats, clock_for, measure_iteration_time

# The breakdown averages a few recorded iterations of fast models, up to this much time.
RECORDING_BUDGET_MS = 200.0
MAX_RECORDED_ITERATIONS = 3


class OutOfMemoryAtBatchSize(Exception):
    def __init__(self, batch_size: int, cause: BaseException) -> None:
        super().__init__(f"out of memory at batch size {batch_size}: {cause}")
        self.batch_size = batch_size


@dataclass(frozen=True)
class Sample:
    batch_size: int
    timing: TimingStats
    peak_memory_bytes: int
    # The per-line and per-operation breakdown (the document's `lines`, `operations`, `weights`,
    # `untracked`, ...), when it was asked for.
    breakdown: dict | None = None

    @property
    def run_time_ms(self) -> float:
        return self.timing.median_ms

    def to_dict(self) -> dict:
        return {
            "batch_size": self.batch_size,
            "run_time_ms": self.run_time_ms,
            "run_time_iqr_ms": self.timing.iqr_ms,
            "repetitions": self.timing.iterations,
            "peak_memory_bytes": self.peak_memory_bytes,
        }


class IterationRunner:
    """Builds the user's model and iteration once, then measures them at any batch size."""

    def __init__(self, entry: EntryPoint, device: torch.device, budget: TimingBudget) -> None:
        self.entry = entry
        self.device = device
        self.budget = budget
        self.clock = clock_for(device)
        pin_malloc_thresholds()  # before the model's memory is allocated
        self.call_sites = CallSites(entry.files)
        self.creation = CreationSites(self.call_sites)
        with self._default_device():
            with self.creation.recording_modules():
                self.model = entry.call(MODEL_PROVIDER, entry.model_provider)
            _check_model(self.model, entry)
            self.iteration = entry.call(ITERATION_PROVIDER, entry.iteration_provider, self.model)
        if not callable(self.iteration):
            raise EntryPointError(
                f"`{ITERATION_PROVIDER}` returned {_describe(self.iteration)}, not a function.",
                path=entry.relative_path,
                line=entry.line_of(entry.iteration_provider),
                hint="Return the function that runs one training iteration: `return iteration`.",
            )
        self._last_output: Any | None = None
        self.model.register_forward_hook(self._remember_output)
        self._ran_once = False
        self.live_tensors = LiveTensors()
        self._frozen = contextlib.ExitStack()

    def __enter__(self) -> IterationRunner:
        """Measure inside `with runner:`: what is alive now (torch, the engine, the model) is frozen
        for the garbage collector while measuring, so each memory measurement scans only what was
        created since, and collections during timed iterations do not walk the engine's objects
        (see LiveTensors)."""
        self._frozen.enter_context(self.live_tensors.frozen())
        return self

    def __exit__(self, *exc) -> None:
        self._frozen.close()

    def measure(
        self,
        batch_size: int,
        breakdown: bool = False,
        timeline: bool = False,
        on_breakdown: Callable[[Sample], None] | None = None,
    ) -> Sample:
        """Time and peak memory at `batch_size`, and with `breakdown` the per-line breakdown (with
        `timeline`, its operations one by one); raises OutOfMemoryAtBatchSize when it does not fit.

        With `breakdown`, `on_breakdown` receives a first Sample as soon as one recorded iteration
        is broken down, before the timing: its time comes from a single iteration (see
        `_provisional_timing`) and the Sample returned at the end replaces it."""
        inputs = None
        try:
            inputs = self._inputs(batch_size)
            run = functools.partial(self._call_iteration, inputs, batch_size)
            warmup_ms = self._warm_up(run)
            recorder = None
            if breakdown:
                recorder, peak, recorded_ms = self._record_first(run)
                if on_breakdown is not None:
                    timing = _provisional_timing(warmup_ms, recorded_ms)
                    on_breakdown(Sample(batch_size, timing, peak, self._breakdown(recorder, timing, peak, timeline)))
            else:
                peak = measure_peak_bytes(self.device, run, self.live_tensors)
            self._check_loss_finite(batch_size)
            timing = measure_iteration_time(run, self.clock, self.budget)
            self._check_loss_finite(batch_size)
            self._check_parameters_finite(batch_size)
            parts = None
            if recorder is not None:
                self._record_more(recorder, run, timing.median_ms)
                parts = self._breakdown(recorder, timing, peak, timeline)
            return Sample(batch_size, timing, peak, parts)
        except (UserCodeError, RuntimeError, MemoryError) as exc:
            cause = exc.__cause__ if isinstance(exc, UserCodeError) and exc.__cause__ is not None else exc
            if is_out_of_memory(cause):
                raise OutOfMemoryAtBatchSize(batch_size, cause) from None
            raise
        finally:
            del inputs
            self._last_output = None
            release_cached_memory(self.device)

    def _warm_up(self, run: Callable[[], None]) -> float:
        """The warm-up iterations; the time of the last one (infinite when none ran).

        Skyline's observation: optimizers such as Adam create their state in the first step, so
        memory is measured after a warm-up (steady state). Later batch sizes need none on CPU (the
        state exists, nothing is tuned per shape, and the memory iteration comes before timing);
        cuDNN picks its algorithms per shape, so CUDA warms up at every batch size."""
        first = not self._ran_once
        if not first and self.device.type != "cuda":
            return math.inf
        with self.creation.finding_optimizers(self.entry.relative_path) if first else contextlib.nullcontext():
            for _ in range(self.budget.warmup_iterations - 1):
                run()
            return self.clock.time_ms(run)

    def _record_first(self, run: Callable[[], None]):
        """One iteration recorded operation by operation, with its peak memory measured in the same
        iteration (on CPU counted by the recorder itself, outside its timer), and its wall time."""
        module_names = {id(m): name for name, m in self.model.named_modules(prefix="model")}
        counter = StorageCounter(self.live_tensors) if self.device.type == "cpu" else None
        recorder = OperationRecorder(self.call_sites, module_names, self.device, memory=counter)
        wall_ms = []
        with recorder:
            recorder.start_iteration()
            if counter is not None:
                wall_ms.append(self.clock.time_ms(run))
                peak = counter.peak_bytes
            else:  # CUDA: the caching allocator's own peak
                peak = measure_peak_bytes(self.device, lambda: wall_ms.append(self.clock.time_ms(run)))
        recorder.memory = None  # further recorded iterations only add to the breakdown
        return recorder, peak, wall_ms[0]

    def _record_more(self, recorder: OperationRecorder, run: Callable[[], None], run_time_ms: float) -> None:
        """Fast models: average the breakdown over a few more recorded iterations, within
        RECORDING_BUDGET_MS, now that the first result is out."""
        more = min(MAX_RECORDED_ITERATIONS, int(RECORDING_BUDGET_MS // max(run_time_ms, 1e-3))) - 1
        if more <= 0:
            return
        with recorder:
            for _ in range(more):
                recorder.start_iteration()
                run()

    def _breakdown(self, recorder: OperationRecorder, timing: TimingStats, peak: int, timeline: bool) -> dict:
        return build_breakdown(
            recorder.recording,
            len(recorder.recording.iteration_starts),
            self.model,
            self.creation,
            timing.median_ms,
            peak,
            timeline=timeline,
        )

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
                hint="Wrap the inputs in a tuple, e.g. `return (images, labels)` or `return (x,)`.",
            )
        return tuple(inputs)

    def _call_iteration(self, inputs: Sequence[Any], batch_size: int) -> None:
        try:
            self.iteration(*inputs)
        except (Exception, SystemExit) as exc:  # sys.exit() would end Skyline silently
            if is_out_of_memory(exc):
                raise
            raise self._iteration_error(exc, batch_size) from exc
        self._ran_once = True

    def _iteration_error(self, exc: BaseException, batch_size: int) -> UserCodeError:
        where = f"the training iteration at batch size {batch_size}"
        if self._ran_once:
            where += ", after it had run at another batch size"
        error = user_code_error(self.entry.files, where, exc, fallback=self.iteration)
        if isinstance(exc, TypeError) and innermost_user_frame(exc.__traceback__, self.entry.files) is None:
            # It failed before running a line of the user's: the inputs do not match its parameters.
            error.hint = f"Skyline calls it as `iteration(*inputs)` with what `{INPUT_PROVIDER}` returns."
        return error

    def _remember_output(self, module, args, output) -> None:
        self._last_output = output

    def _check_loss_finite(self, batch_size: int) -> None:
        loss = self._last_output
        if isinstance(loss, torch.Tensor) and loss.numel() == 1 and loss.is_floating_point():
            value = float(loss.detach())
            if not math.isfinite(value):
                kind = "NaN" if math.isnan(value) else f"infinite ({value})"
                raise self._not_finite_error(f"the loss the model returned at batch size {batch_size} is {kind}")

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

    def _model_forward_location(self):
        forward = getattr(type(self.model), "forward", None)
        code = getattr(forward, "__code__", None)
        if code is not None and self.entry.files.contains(code.co_filename):
            return self.entry.files.relative(code.co_filename), code.co_firstlineno
        return self.entry.relative_path, self.entry.line_of(self.entry.model_provider)

    def _default_device(self):
        # Providers create tensors and modules on the analysis device without naming it. The
        # iteration itself runs without a default device: torch implements it as a function mode
        # that would add overhead to every operation we time.
        if self.device.type == "cpu":
            return contextlib.nullcontext()
        return torch.device(self.device)


def _provisional_timing(warmup_ms: float, recorded_ms: float) -> TimingStats:
    """The iteration's time before it is timed: the last warm-up iteration may still carry one-off
    costs and the recorded one carries the recorder's, so both are upper bounds; the lower is used."""
    return TimingStats(min(warmup_ms, recorded_ms), 0.0, 1, 1)


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
