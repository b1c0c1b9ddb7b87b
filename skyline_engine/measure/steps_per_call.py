"""How many optimizer steps each call of the iteration made: whether every call does the same work.

Skyline measures one call of the iteration function as one training iteration: the time is an
average over many calls, but the per-line breakdown records a few consecutive calls, and each batch
size's peak memory is one call's. A loop that steps every k-th call (gradients accumulated across
calls, a GAN's generator stepped every fifth call) does different work on different calls, so the
recorded calls may lack the step, and the peaks of two batch sizes may come from calls that differ.
torch's global optimizer step hook counts the steps of each call, in steady state only (a
GradScaler skips its first steps; measure/iteration.py warms up past them).
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field

# A call pattern rarer than this share of the calls is left unsaid: a GradScaler skips a step when
# its scale overflows, once in thousands of steps, which changes no figure.
RARE_SHARE = 0.01
# The breakdown records one whole cycle of calls up to this many (StepsPerCall.cycle).
MAX_CYCLE = 16


@dataclass
class StepsPerCall:
    """The number of calls that made each number of optimizer steps, and the steps of the latest
    calls, in order."""

    calls: collections.Counter[int] = field(default_factory=collections.Counter)
    recent: collections.deque[int] = field(default_factory=lambda: collections.deque(maxlen=4 * MAX_CYCLE))

    def add(self, steps: int) -> None:
        self.calls[steps] += 1
        self.recent.append(steps)

    def varies(self) -> bool:
        """Whether calls made different numbers of steps, each often enough to matter."""
        total = sum(self.calls.values())
        return sum(1 for count in self.calls.values() if count >= RARE_SHARE * total) > 1

    def cycle(self) -> int | None:
        """How many calls make one cycle, where calls differ: the distance between the latest calls
        that made the rarest number of steps, when it is always the same and at most MAX_CYCLE; 1
        for calls that do not differ, or not in such a cycle; None while the latest calls hold the
        rarest number only once (more calls will tell)."""
        if not self.varies():
            return 1
        rarest = self._rarest()
        at = [i for i, steps in enumerate(self.recent) if steps == rarest]
        if len(at) < 2:
            return None if len(self.recent) < (self.recent.maxlen or 0) else 1
        distances = {later - earlier for earlier, later in zip(at, at[1:])}
        if len(distances) != 1:
            return 1
        (distance,) = distances
        return distance if distance <= MAX_CYCLE else 1

    def ends_a_cycle(self) -> bool:
        """Whether the latest call made the rarest number of steps: the next starts a cycle."""
        return bool(self.recent) and self.recent[-1] == self._rarest()

    def _rarest(self) -> int:
        """The number of steps the fewest calls made (the call that ends a cycle makes it)."""
        return min(self.calls, key=lambda steps: self.calls[steps])

    def warning(self, recorded_calls: int = 1) -> str | None:
        """What the user should know when calls differ, the breakdown having recorded
        `recorded_calls` consecutive calls; None when calls do not differ."""
        if not self.varies():
            return None
        total = sum(self.calls.values())
        parts = [f"{count:,} {_steps(steps)}" for steps, count in sorted(self.calls.items(), key=lambda kv: -kv[1])]
        cycle = self.cycle() or 1
        every = f" (one call in {cycle})" if cycle > 2 else ""
        said = (
            f"Your iteration does not do the same work on every call: of {total:,} calls measured, "
            f"{_join(parts)}{every}."
        )
        whole_cycle = (
            "make one call one whole cycle (loop over the accumulated micro-batches, or over the critic's steps "
            "and then the generator's, inside the iteration)"
        )
        if cycle > 1 and recorded_calls == cycle:
            return (
                f"{said} Skyline measured it in whole cycles of {cycle} calls: the per-line breakdown averages "
                "one cycle, and each batch size's peak memory and time cover whole cycles; the throughput counts "
                f"the samples of one call. To profile one cycle as one iteration, {whole_cycle}."
            )
        return (
            f"{said} Skyline measures one call as one iteration: the throughput averages many calls and holds, "
            "but the per-line breakdown shows the few calls it recorded, which may lack a step, and each batch "
            "size's peak memory comes from one call, with or without a step. "
            f"{whole_cycle[0].upper()}{whole_cycle[1:]} and profile again."
        )


def _steps(steps: int) -> str:
    if steps == 0:
        return "stepped no optimizer"
    return "made one optimizer step" if steps == 1 else f"made {steps} optimizer steps"


def _join(parts: list[str]) -> str:
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]
