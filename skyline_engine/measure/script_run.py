"""A training script's iterations, one at a time: the script runs, and pauses at each optimizer step.

The script's own loop drives the training, so its iterations cannot be called as an entry point's
are. It runs in a greenlet (a second stack in the same thread: torch's thread-local state, its
dispatch modes and grad mode, are the same on both sides, so what the engine switches on around
"one iteration" sees the script's operations) and switches back to the engine after each step of
the optimizer that stepped first (the one whose steps end an iteration; backward passes between
two of its steps are micro-batches). That optimizer is found by torch's global step post-hook; the
pause itself comes once its `step` has returned, from a wrapper set on that optimizer object (a
pause inside the hook left torch iterating its hooks' dictionary, which the engine's own hooks
then changed: "OrderedDict mutated during iteration"). The wrapper is removed when the run ends.
`iteration()` resumes the script until its next step: one training iteration, its own data
loading included. `stop()` ends the script where it paused, by raising StopScript there: it never
reaches what follows its loop (saving a checkpoint, a final evaluation).

A script that does not step within `step_timeout_s` (one that evaluates, prepares data or waits,
and never trains) is stopped where it runs: a timer (SIGALRM, in the main thread where the analysis
runs; nothing elsewhere) raises NoStepInTime into it, and the error names the line it was running.
Should the script catch it and run on, it is raised again each second; after the third, the script
is left suspended where it is (never resumed: resuming it would run it on) and the engine goes on.
"""

from __future__ import annotations

import functools
import signal
import threading
import weakref
from time import monotonic  # bound now: user code may replace time's (freezegun)
from types import FrameType
from typing import Any, Callable, Protocol

import greenlet
import torch
from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.utils.hooks import RemovableHandle

from skyline_engine.entry.loader import user_code_error
from skyline_engine.entry.script import TrainingScript
from skyline_engine.entry.user_frames import innermost_user_frame_of_stack
from skyline_engine.errors import EntryPointError

# Thrown at most this many times into a script that catches it (`except BaseException`) and runs on.
_STOP_ATTEMPTS = 3
# How long a script may run without an optimizer step (its setup included: loading a dataset).
STEP_TIMEOUT_S = 300.0
# Should the script catch NoStepInTime and run on, it is raised again this often.
_RETRY_S = 1.0
# Scripts that caught every stop and ran on, left suspended: kept here, since a greenlet collected
# while suspended is resumed (with GreenletExit) and would run on.
_ABANDONED: list[greenlet.greenlet] = []


class StopScript(BaseException):
    """Ends the script where it paused (a BaseException: `except Exception` lets it through)."""


class NoStepInTime(BaseException):
    """Raised into the script where it runs when it has not stepped in time (a BaseException:
    `except Exception` lets it through)."""


class ScriptEnded(EntryPointError):
    """The script returned, or exited with status 0, while the engine wanted another iteration."""

    def __init__(self, script: TrainingScript, steps: int) -> None:
        if steps == 0:
            message = (
                f"{script.relative_path} ran to its end without an optimizer step: Skyline measures training "
                "iterations, from one `optimizer.step()` to the next."
            )
            hint = "Profile the script that trains, with the arguments that make it train (`-- --epochs 1`)."
        else:
            message = (
                f"{script.relative_path} ended after {steps} optimizer step{'s' if steps != 1 else ''}, before "
                "Skyline had measured enough iterations."
            )
            hint = "Let it train longer (more epochs or steps), e.g. with its arguments after `--`."
        super().__init__(message, path=script.relative_path, hint=hint)
        self.steps = steps


class Pacer(Protocol):
    """Told of each run and of each iteration before it runs: the other ranks of a data-parallel
    script run the same (analysis/script_ranks.py)."""

    def started(self, batch_size: int | None) -> None: ...
    def iteration(self) -> None: ...
    def ended(self) -> None: ...


class ScriptRun:
    """One run of `script`, paused at its optimizer steps. Use it inside `with`: the hook and
    the script end with it."""

    def __init__(
        self, script: TrainingScript, step_timeout_s: float = STEP_TIMEOUT_S, pacer: Pacer | None = None
    ) -> None:
        self.script = script
        self.step_timeout_s = step_timeout_s
        self.pacer = pacer
        self.steps = 0  # of the optimizer that ends an iteration
        self._engine: greenlet.greenlet | None = None
        self._script: greenlet.greenlet | None = None
        self._lead: weakref.ref[torch.optim.Optimizer] | None = None
        self._hook: RemovableHandle | None = None
        self._unwrap: Callable[[], None] = lambda: None  # the optimizer's `step` as it was
        self._alarm: Any = None  # SIGALRM's handler before ours; None where there is no timer
        self._timer: tuple[tuple[float, float], float] = ((0.0, 0.0), 0.0)  # one set before, and when
        self._alarms = 0  # NoStepInTime raised so far
        self.stopped_at: tuple[str, int | None] | None = None  # the user's line it ran when the timer first went off

    def __enter__(self) -> ScriptRun:
        if self.pacer is not None:
            self.pacer.started(self.script.batch_size_set)
        self._engine = greenlet.getcurrent()
        self._script = greenlet.greenlet(self._main, parent=self._engine)
        self._hook = register_optimizer_step_post_hook(self._stepped)
        if hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread():
            # A timer already set (pytest-timeout's, a user's alarm) goes on once the run ends.
            self._timer = (signal.getitimer(signal.ITIMER_REAL), monotonic())
            self._alarm = signal.signal(signal.SIGALRM, self._out_of_time)
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.stop()
        finally:
            if self._alarm is not None:
                signal.setitimer(signal.ITIMER_REAL, 0)
                signal.signal(signal.SIGALRM, self._alarm)
                (delay, interval), set_at = self._timer
                if delay > 0:
                    signal.setitimer(signal.ITIMER_REAL, max(1e-3, delay - (monotonic() - set_at)), interval)
            if self._hook is not None:
                self._hook.remove()
            self._unwrap()
            _leave_the_process_group()
            if self.pacer is not None:
                self.pacer.ended()

    @property
    def steps_taken(self) -> int:
        """The optimizer steps the script took (the first one found the optimizer, and paused nothing)."""
        return self.steps + (self._lead is not None)

    @property
    def optimizer(self) -> torch.optim.Optimizer | None:
        """The optimizer whose steps end an iteration, once one stepped."""
        return self._lead() if self._lead is not None else None

    def iteration(self) -> None:
        """Run the script until its next optimizer step (the first call: its setup and its first
        two iterations, the first finding the optimizer). A UserCodeError at the user's line when
        it raises; ScriptEnded when it ends; an EntryPointError at the line it was running when it
        did not step within `step_timeout_s` (each process runs one analysis, so a script left
        suspended then takes nothing with it but its own process's state)."""
        assert self._script is not None, "use ScriptRun inside `with`"
        steps = self.steps
        if self.pacer is not None:
            self.pacer.iteration()
        try:
            if self._alarm is not None:
                signal.setitimer(signal.ITIMER_REAL, self.step_timeout_s, _RETRY_S)
            try:
                self._script.switch()
            finally:
                if self._alarm is not None:
                    signal.setitimer(signal.ITIMER_REAL, 0)
        except StopScript:
            raise
        except NoStepInTime:
            raise self._no_step_error() from None
        except (Exception, SystemExit) as exc:
            if isinstance(exc, SystemExit) and exc.code in (None, 0):
                raise ScriptEnded(self.script, self.steps_taken) from None
            raise user_code_error(self.script.files, f"the training script {self.script.relative_path}", exc) from exc
        if self._script.dead or self.steps == steps:
            raise ScriptEnded(self.script, self.steps_taken)

    def stop(self) -> None:
        """End the script where it paused (nothing when it has not started or has ended)."""
        for _ in range(_STOP_ATTEMPTS):
            if self._script is None or self._script.dead or not self._script or self._script in _ABANDONED:
                return
            try:
                self._script.throw(StopScript())
            except (StopScript, Exception, SystemExit):  # noqa: BLE001
                return  # ended: by the stop, or by whatever the user's code raised on its way out

    def _out_of_time(self, signum: int, frame: FrameType | None) -> None:
        script = greenlet.getcurrent()
        if script is not self._script:  # the step came as the timer went off
            return
        if self.stopped_at is None:
            where = innermost_user_frame_of_stack(frame, self.script.files)
            self.stopped_at = (self.script.files.relative(where.filename), where.lineno) if where else None
        self._alarms += 1
        if self._alarms <= _STOP_ATTEMPTS:
            raise NoStepInTime
        _ABANDONED.append(script)
        assert self._engine is not None
        self._engine.throw(NoStepInTime())

    def _no_step_error(self) -> EntryPointError:
        path, line = self.stopped_at or (self.script.relative_path, None)
        waited = f"{self.step_timeout_s:g} s"
        steps = self.steps_taken
        if steps == 0:
            said = f"{self.script.relative_path} ran {waited} without an optimizer step"
        else:
            plural = "s" if steps != 1 else ""
            said = f"{self.script.relative_path} ran {waited} after {steps} optimizer step{plural} without another"
        return EntryPointError(
            f"{said}: Skyline measures training iterations, from one `optimizer.step()` to the next, and stopped it "
            "here.",
            path=path,
            line=line,
            hint="Profile the script that trains (an evaluation or data-preparation script steps no optimizer); "
            "for a setup or an iteration slower than this, give more time with --step-timeout S.",
        )

    def _main(self) -> None:
        with self.script.as_main() as globals_:
            exec(self.script.code, globals_)

    def _stepped(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if self._lead is not None or greenlet.getcurrent() is not self._script:
            return  # found already; or a step the engine's own code made, or another thread's
        self._lead = weakref.ref(optimizer)
        stepped = optimizer.step  # bound: the class's step, or what a scheduler set on the object

        @functools.wraps(stepped)
        def step_then_pause(*args: Any, **kwargs: Any) -> Any:
            out = stepped(*args, **kwargs)
            if greenlet.getcurrent() is self._script:
                self.steps += 1
                assert self._engine is not None
                self._engine.switch()
            return out

        optimizer.step = step_then_pause  # type: ignore[method-assign]
        self._unwrap = lambda: _restore(optimizer, step_then_pause, stepped)


def _leave_the_process_group() -> None:
    """The process group a stopped script left behind, destroyed: the next run of the script joins
    its own (`init_process_group` twice in one process fails)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def _restore(optimizer: torch.optim.Optimizer, wrapper: Any, stepped: Any) -> None:
    """The optimizer's `step` as it was, unless something wrapped ours meanwhile (then ours stays,
    passing through: the run is over)."""
    if optimizer.__dict__.get("step") is wrapper:
        if (
            getattr(stepped, "__self__", None) is optimizer
            and getattr(stepped, "__func__", None) is type(optimizer).step
        ):
            del optimizer.step
        else:
            optimizer.step = stepped  # type: ignore[method-assign]
