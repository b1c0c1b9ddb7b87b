"""What each call of the iteration did: whether every call does the same work.

Skyline measures one call of the iteration function as one training iteration: the time is an
estimate over many calls, but the per-line breakdown records a few consecutive calls, and each
batch size's peak memory is one call's. A loop that does more on some calls than on others (steps
every k-th call: gradients accumulated across calls, a GAN's generator stepped every fifth call;
an evaluation every tenth call) does different work on different calls, so the recorded calls may
lack that work, the peaks of two batch sizes may come from calls that differ, and the time, over
blocks of calls that begin anywhere in the cycle (measure/timing.py), leans to where they begin. Two counts
tell the calls apart at no cost to what is timed: torch's global optimizer step hook counts each
call's steps, and a forward hook on the model its passes through the model; both in steady state
only (a GradScaler skips its first steps; measure/iteration.py warms up past them).
"""

from __future__ import annotations

import collections
import math
from dataclasses import dataclass, field
from typing import Callable

# A kind of work fewer calls did than this share of them, or than MIN_CALLS, is no pattern and is
# left unsaid: a GradScaler skips a step when its scale overflows, a step or two soon after its
# first and then once in thousands, which changes no figure (one skip among 30 calls measured on a
# busy machine was told as calls that differ).
RARE_SHARE = 0.01
MIN_CALLS = 3
# The breakdown records one whole cycle of calls up to this many (WorkPerCall.cycle), when the
# cycle takes at most CYCLE_BUDGET_MS (as timed; recorded, calls run slower).
MAX_CYCLE = 16
CYCLE_BUDGET_MS = 2000.0


@dataclass(frozen=True)
class CallWork:
    """What one call did: the optimizer steps it made and the times it ran the model."""

    steps: int
    forwards: int


@dataclass
class WorkPerCall:
    """At one batch size: the number of calls that did each kind of work, and the latest calls'
    work with their numbers among all the iteration's calls, in order. (Calls are told apart at
    each batch size alone: a loop that splits the batch into chunks runs the model more often at
    larger batch sizes, and its calls differ only from one batch size to another.)"""

    calls: collections.Counter[CallWork] = field(default_factory=collections.Counter)
    recent: collections.deque[tuple[int, CallWork]] = field(
        default_factory=lambda: collections.deque(maxlen=4 * MAX_CYCLE)
    )

    def add(self, work: CallWork, call: int) -> None:
        """`work` done by the iteration's call number `call` (counting the calls at every batch size)."""
        self.calls[work] += 1
        self.recent.append((call, work))

    def usual(self) -> CallWork | None:
        """The work most calls did; None before any call."""
        return max(self.calls, key=lambda work: self.calls[work]) if self.calls else None

    def varies(self) -> bool:
        """Whether calls did different work, each often enough to matter."""
        return len(self._patterns()) > 1

    def cycle(self) -> int | None:
        """How many calls make one cycle, where calls differ: the period, at most MAX_CYCLE, at
        which the latest calls did the rarest work, those calls and no others (counted by their
        numbers: calls at other batch sizes may come between); 1 for calls that do not differ, or
        not in such a cycle; None while some work was done too few times to tell (more calls
        will)."""
        full = len(self.recent) >= (self.recent.maxlen or 0)
        if not self.varies():
            return None if len(self.calls) > 1 and not full else 1
        rarest = self._rarest()
        at = [call for call, work in self.recent if work == rarest]
        if len(at) < 2:
            return None if not full else 1
        period = math.gcd(*(later - earlier for earlier, later in zip(at, at[1:])))
        if any((work == rarest) != ((call - at[0]) % period == 0) for call, work in self.recent):
            return 1
        return period if period <= MAX_CYCLE else 1

    def last_cycle_end(self) -> int | None:
        """The number of the latest call that did the rarest work, which ends a cycle (the next
        starts one); None when none of the latest calls did."""
        if not self.recent:
            return None
        rarest = self._rarest()
        return next((call for call, work in reversed(self.recent) if work == rarest), None)

    def _patterns(self) -> list[CallWork]:
        """The kinds of work done often enough to matter (RARE_SHARE, MIN_CALLS)."""
        least = max(MIN_CALLS, RARE_SHARE * sum(self.calls.values()))
        return [work for work, count in self.calls.items() if count >= least]

    def _rarest(self) -> CallWork:
        """Of the kinds of work that matter, the one the fewest calls did (the call that ends a
        cycle does it); of all, where none does."""
        return min(self._patterns() or self.calls, key=lambda work: self.calls[work])

    def warning(self, recorded_calls: int = 1) -> str | None:
        """What the user should know when calls differ, the breakdown having recorded
        `recorded_calls` consecutive calls; None when calls do not differ."""
        if not self.varies():
            return None
        cycle = self.cycle() or 1
        every = f" (one call in {cycle})" if cycle > 2 else ""
        said = f"Your iteration does not do the same work on every call: {self._measured('call')}{every}."
        advice = _advice(len({work.steps for work in self.calls}) > 1)
        if cycle > 1 and recorded_calls == cycle:
            return (
                f"{said} Skyline measured it in whole cycles of {cycle} calls: the per-line breakdown averages "
                "one cycle, and each batch size's peak memory and time cover whole cycles; the throughput counts "
                f"the samples of one call. {advice}."
            )
        return (
            f"{said} Skyline measures one call as one iteration, and the calls differ too rarely or too "
            "irregularly to measure whole cycles of them: the time is the mean over the calls it timed, with "
            "the rarer work as often as it came among them; the per-line breakdown shows the few calls it "
            "recorded, which may lack the rarer work, and each batch size's peak memory comes from one call, "
            "with or without it. "
            f"{advice}, and profile again."
        )

    def script_warning(self, recorded_iterations: int = 1) -> str | None:
        """`warning`, for a training script's iterations (each from one optimizer step to the next:
        the script's loop, not a call Skyline makes, so they differ by their passes through the model)."""
        if not self.varies():
            return None
        cycle = self.cycle() or 1
        every = f" (one in {cycle})" if cycle > 2 else ""
        said = (
            "Your training iterations (each from one optimizer step to the next) do not all do the same work: "
            f"{self._measured('iteration')}{every}."
        )
        if cycle > 1 and recorded_iterations == cycle:
            return (
                f"{said} Skyline measured them in whole cycles of {cycle}: the per-line breakdown averages one cycle, "
                "and the peak memory and the time cover whole cycles, so the time per iteration holds the rarer work "
                "(an evaluation every few steps, say) spread over the cycle."
            )
        return (
            f"{said} They differ too rarely or too irregularly to measure whole cycles of them: the time is the "
            "mean over the iterations timed, with the rarer work as often as it came among them; the per-line "
            "breakdown shows the few iterations it recorded, which may lack the rarer work, and the peak memory "
            "comes from one iteration, with or without it."
        )

    def _measured(self, unit: str) -> str:
        """How many `unit`s were measured, and what each kind of them did."""
        steps_differ = len({work.steps for work in self.calls}) > 1
        forwards_differ = len({work.forwards for work in self.calls}) > 1
        parts = [
            f"{count:,} {_work(work, steps_differ, forwards_differ)}"
            for work, count in sorted(self.calls.items(), key=lambda kv: -kv[1])
        ]
        return f"of {sum(self.calls.values()):,} {unit}s measured, {_join(parts)}"


def find_cycle(calls: WorkPerCall, run: Callable[[], None], run_time_ms: float) -> int:
    """How many calls make one cycle where `calls` differ (1 where they do not, or not in a
    cycle), running a few more calls of `run` (within CYCLE_BUDGET_MS, at `run_time_ms` each;
    `run` adds its work to `calls`) where those seen so far do not tell."""
    for _ in range(min(2 * MAX_CYCLE, int(CYCLE_BUDGET_MS // max(run_time_ms, 1e-3)))):
        cycle = calls.cycle()
        if cycle is not None:
            return cycle
        run()
    return calls.cycle() or 1


def cycle_fits(cycle: int, run_time_ms: float) -> bool:
    """Whether calls that differ in a cycle of `cycle` calls of `run_time_ms` each are measured in
    whole cycles: one whole cycle fits CYCLE_BUDGET_MS."""
    return cycle > 1 and cycle * run_time_ms <= CYCLE_BUDGET_MS


def _work(work: CallWork, steps_differ: bool, forwards_differ: bool) -> str:
    """What calls that did `work` did, in the terms that tell them apart."""
    said = []
    if forwards_differ:
        said.append(
            "ran the model " + {0: "not at all", 1: "once", 2: "twice"}.get(work.forwards, f"{work.forwards} times")
        )
    if steps_differ or not forwards_differ:
        said.append(_steps(work.steps))
    return " and ".join(said)


def _steps(steps: int) -> str:
    if steps == 0:
        return "stepped no optimizer"
    return "made one optimizer step" if steps == 1 else f"made {steps} optimizer steps"


def _advice(steps_differ: bool) -> str:
    """How to make every call do the same work."""
    if steps_differ:
        return (
            "To profile one cycle as one iteration, make one call one whole cycle (loop over the accumulated "
            "micro-batches, or over the critic's steps and then the generator's, inside the iteration)"
        )
    return (
        "To profile training alone, run what runs the model on some calls only (an evaluation every few calls, "
        "say) outside the iteration"
    )


def _join(parts: list[str]) -> str:
    if len(parts) == 1:
        return parts[0]
    # Parts that say two things each ("ran the model once and made one optimizer step") need a
    # comma before the last to stay apart.
    last = ", and " if any(" and " in part for part in parts) else " and "
    return ", ".join(parts[:-1]) + last + parts[-1]
