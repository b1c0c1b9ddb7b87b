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
"""

from __future__ import annotations

import functools
import weakref
from typing import Any, Callable

import greenlet
import torch
from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.utils.hooks import RemovableHandle

from skyline_engine.entry.loader import user_code_error
from skyline_engine.entry.script import TrainingScript
from skyline_engine.errors import EntryPointError

# Thrown at most this many times into a script that catches it (`except BaseException`) and runs on.
_STOP_ATTEMPTS = 3


class StopScript(BaseException):
    """Ends the script where it paused (a BaseException: `except Exception` lets it through)."""


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


class ScriptRun:
    """One run of `script`, paused at its optimizer steps. Use it inside `with`: the hook and
    the script end with it."""

    def __init__(self, script: TrainingScript) -> None:
        self.script = script
        self.steps = 0  # of the optimizer that ends an iteration
        self._engine: greenlet.greenlet | None = None
        self._script: greenlet.greenlet | None = None
        self._lead: weakref.ref[torch.optim.Optimizer] | None = None
        self._hook: RemovableHandle | None = None
        self._unwrap: Callable[[], None] = lambda: None  # the optimizer's `step` as it was

    def __enter__(self) -> ScriptRun:
        self._engine = greenlet.getcurrent()
        self._script = greenlet.greenlet(self._main, parent=self._engine)
        self._hook = register_optimizer_step_post_hook(self._stepped)
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.stop()
        finally:
            if self._hook is not None:
                self._hook.remove()
            self._unwrap()

    @property
    def optimizer(self) -> torch.optim.Optimizer | None:
        """The optimizer whose steps end an iteration, once one stepped."""
        return self._lead() if self._lead is not None else None

    def iteration(self) -> None:
        """Run the script until its next optimizer step (the first call: its setup and its first
        two iterations, the first finding the optimizer). A
        UserCodeError at the user's line when it raises; ScriptEnded when it ends."""
        assert self._script is not None, "use ScriptRun inside `with`"
        steps = self.steps
        try:
            self._script.switch()
        except StopScript:
            raise
        except (Exception, SystemExit) as exc:
            if isinstance(exc, SystemExit) and exc.code in (None, 0):
                raise ScriptEnded(self.script, self.steps) from None
            raise user_code_error(self.script.files, f"the training script {self.script.relative_path}", exc) from exc
        if self._script.dead or self.steps == steps:
            raise ScriptEnded(self.script, self.steps)

    def stop(self) -> None:
        """End the script where it paused (nothing when it has not started or has ended)."""
        for _ in range(_STOP_ATTEMPTS):
            if self._script is None or self._script.dead or not self._script:
                return
            try:
                self._script.throw(StopScript())
            except (StopScript, Exception, SystemExit):  # noqa: BLE001
                return  # ended: by the stop, or by whatever the user's code raised on its way out

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
