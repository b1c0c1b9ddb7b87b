"""Choosing the batch sizes to measure for the batch-size models, around the user's, OOM-aware.

The user's batch size is measured first (it must fit: it is what they train with), then half of
it, then twice it. Probing measures memory only (one iteration each): the batch sizes are timed
afterwards, together (analysis/session.py). Before a larger probe, the peak-memory model of the
sizes so far says whether it would fit; a probe that runs out of memory anyway narrows the range
(halfway back towards the user's batch size) and never ends the analysis. Nor does a probe that
fails in the user's code (BatchNorm refuses one sample; a view hard-codes a size): it is noted with
its file and line, and nothing beyond it, on its side of the user's batch size, is tried.
"""

from __future__ import annotations

from typing import Callable

from skyline_engine.errors import UserCodeError
from skyline_engine.measure.iteration import OutOfMemoryAtBatchSize
from skyline_engine.measure.memory import MemoryProfile
from skyline_engine.predict.batch_models import TRUSTED_FACTOR, beyond_a_failure
from skyline_engine.predict.peak_memory import PER_OPERATION, PeakMemoryModel, fit_peak_memory

PROBES = 3
# Each out-of-memory probe costs an iteration; after this many, larger batch sizes are abandoned.
LARGER_ATTEMPTS = 3
# The memory model is settled when it reproduces the measured peaks this closely, fitted per
# operation (tensor sizes affine in the batch size); otherwise memory-only probes look further.
SETTLED_RESIDUAL = 0.01
# Memory-only probes at these multiples of the largest batch size measured so far.
FURTHER = (4, 16)
Progress = Callable[[str, float], None]
MeasureMemory = Callable[[int], MemoryProfile]
# The memory of a batch size known without measuring it (analysis/known_memory.py), or None.
KnownMemoryOf = Callable[[int], "MemoryProfile | None"]


def nothing_known(batch_size: int) -> MemoryProfile | None:
    return None


class Probing:
    def __init__(
        self,
        measure_memory: MeasureMemory,
        usable_memory_bytes: int,
        progress: Progress,
        user_batch_size: int,
        users_memory: MemoryProfile,
        measure_memory_only: MeasureMemory | None = None,
        known: KnownMemoryOf = nothing_known,
    ) -> None:
        self.measure_memory = measure_memory
        # What measures a batch size for the memory model alone (a script's runs time the others too).
        self.measure_memory_only = measure_memory_only or measure_memory
        # Taken in place of measuring, where a previous analysis of the same code measured it.
        self.known = known
        self.usable = usable_memory_bytes
        self.progress = progress
        self.user_batch_size = user_batch_size
        self.memory: dict[int, MemoryProfile] = {user_batch_size: users_memory}
        self.memory_only: dict[int, MemoryProfile] = {}  # probed for the memory model alone
        self.notes: list[str] = []
        self._tried: set[int] = {user_batch_size}
        self.failing: list[int] = []  # batch sizes the user's code failed at
        # One warning per line and side that failed: its index in `notes`, its batch sizes, and
        # the message of the one nearest the user's (a confirming step may find 31 failing after
        # 32 at the same line; two warnings saying one thing are noise).
        self._failures: dict[tuple[str, bool], tuple[int, list[int], str]] = {}

    def probe(self) -> list[int]:
        """Up to PROBES-1 more batch sizes around the user's, their memory measured; every batch
        size whose memory is known, ascending."""
        user_batch_size = self.user_batch_size
        self._try(max(1, user_batch_size // 2))
        if not self._try_larger(2 * user_batch_size):
            self._try(max(1, user_batch_size // 4))
        for extra in (3 * user_batch_size, 4 * user_batch_size):
            if len(self.memory) >= PROBES:
                break
            self._try_larger(extra)
        return sorted(self.memory)

    def settle_memory(self, seconds_per_sample: float, budget_s: float) -> None:
        """When the memory model is not settled by the probed batch sizes (the operations differ
        between them, or their bytes are not affine in the batch size, as a GPU allocator's
        rounding or a workspace chosen per shape can make them, or tensors of batch × batch), measure
        memory alone at larger batch sizes, within `budget_s` of predicted iteration time each, and
        up to what is predicted to fit. Then the largest batch size predicted to fit, if it lies
        beyond the trusted range and one iteration there is affordable."""
        for factor in FURTHER:
            known = {**self.memory, **self.memory_only}
            model = fit_peak_memory(list(known), list(known.values()))
            largest = max(known)
            fits = model.largest_within(self.usable)
            if self._settled(model, factor * largest if fits is None else fits):
                break
            target = factor * largest if fits is None else min(factor * largest, fits)
            if target <= largest or self._seconds_at(target, model, seconds_per_sample) > budget_s:
                return
            if not self._measure_memory_only(target, f"measuring the memory of batch size {target}", 0.6):
                return
        self._measure_the_limit(seconds_per_sample, budget_s)

    @staticmethod
    def _settled(model: PeakMemoryModel, asked_at: int) -> bool:
        """Whether `model` reproduces the measured peaks, fitted per operation, and no operation's
        bytes curve upward (a quadratic through three batch sizes) past the predicted peak at
        `asked_at`, the largest batch size it will be asked about. Lines through a contrastive
        loss's operations at 32, 64 and 128 samples, with 4 MB of other tensors alive, reproduced
        those peaks and said 16,328 samples fit in 64 MiB; 1,851 do."""
        return (
            model.fitted == PER_OPERATION
            and model.max_relative_residual <= SETTLED_RESIDUAL
            and not model.may_rise_above(asked_at, SETTLED_RESIDUAL)
        )

    def _measure_the_limit(self, seconds_per_sample: float, budget_s: float) -> None:
        """The largest batch size predicted to fit, measured (memory alone) when it lies beyond
        the trusted range and one iteration there is affordable: planning for a capacity then
        answers with a measured batch size, not an extrapolation."""
        known = {**self.memory, **self.memory_only}
        model = fit_peak_memory(list(known), list(known.values()))
        limit = model.largest_within(self.usable)
        if (
            limit is None
            or limit <= TRUSTED_FACTOR * max(known)
            or self._seconds_at(limit, model, seconds_per_sample) > budget_s
        ):
            return
        self._measure_memory_only(
            limit, f"measuring the memory of batch size {limit}, the largest predicted to fit", 0.65
        )

    def _seconds_at(self, batch_size: int, model: PeakMemoryModel, seconds_per_sample: float) -> float:
        """One iteration's predicted time at `batch_size`: the user's time per sample, times the
        growth of the memory per sample where it grows (tensors of batch × batch: a contrastive
        loss's work grows with the batch size squared as its memory does, and a time per sample
        from the user's batch size put a 20 GiB iteration that took 100 s at 1.2 s)."""
        users = self.memory[self.user_batch_size].peak_bytes / self.user_batch_size
        growth = model(batch_size) / batch_size / users if users > 0 else 1.0
        return batch_size * seconds_per_sample * max(1.0, growth)

    def _measure_memory_only(self, batch_size: int, phase: str, fraction: float) -> bool:
        if self._beyond_a_failure(batch_size):
            return False
        try:
            self.memory_only[batch_size] = self.memory_of(batch_size, phase, fraction, self.measure_memory_only)
            return True
        except OutOfMemoryAtBatchSize:
            self.notes.append(
                f"Batch size {batch_size} ran out of memory; the memory model stops short of it: stay below it on "
                "this device."
            )
        except UserCodeError as error:
            self.fails(batch_size, error)
        return False

    def _try(self, batch_size: int) -> bool:
        if len(self.memory) >= PROBES or batch_size in self._tried or self._beyond_a_failure(batch_size):
            return False
        try:
            self._measure(batch_size)
            return True
        except OutOfMemoryAtBatchSize:
            self.notes.append(
                f"Batch size {batch_size} ran out of memory; it is left out of the models: stay below it on this "
                "device."
            )
        except UserCodeError as error:
            self.fails(batch_size, error)
        return False

    def fails(self, batch_size: int, error: UserCodeError) -> None:
        """The user's code fails at `batch_size`, a batch size they did not ask for: a warning at
        the line that raised (the first line of the error: its frames follow), not the end of the
        analysis, whose other batch sizes ran. Another failure at the same line, on the same side
        of the user's batch size, joins that warning."""
        self.failing.append(batch_size)
        where = f"{error.path}:{error.line}: " if error.path and error.line else ""
        larger = batch_size > self.user_batch_size
        message = error.message.splitlines()[0]
        index, sizes, nearest_message = self._failures.get((where, larger), (len(self.notes), [], message))
        sizes = sorted({*sizes, batch_size})
        nearest = sizes[0] if larger else sizes[-1]
        if nearest == batch_size:
            nearest_message = message
        if len(sizes) == 1:
            left_out = f"batch size {batch_size} out and are no guide {'from it on' if larger else 'at it and below'}"
        else:
            listed = ", ".join(map(str, sizes))
            left_out = f"batch sizes {listed} out and are no guide {'from' if larger else 'at'} {nearest}"
            left_out += " on" if larger else " and below"
        note = f"{where}{nearest_message} The models leave {left_out}."
        self._failures[(where, larger)] = (index, sizes, nearest_message)
        if index == len(self.notes):
            self.notes.append(note)
        else:
            self.notes[index] = note

    def _beyond_a_failure(self, batch_size: int) -> bool:
        """Whether `batch_size` is at or beyond one the user's code failed at, on the same side of
        the user's batch size (a larger probe past a failing one would fail as well, an iteration
        lost)."""
        return beyond_a_failure(batch_size, self.user_batch_size, self.failing)

    def _try_larger(self, batch_size: int) -> bool:
        """Measure a batch size above the user's, lowered to what is predicted to fit and halved
        towards the user's on out-of-memory."""
        candidate = self._largest_predicted_to_fit(batch_size)
        for _ in range(LARGER_ATTEMPTS):
            if (
                candidate <= self.user_batch_size
                or candidate in self._tried
                or len(self.memory) >= PROBES
                or self._beyond_a_failure(candidate)
            ):
                return False
            try:
                self._measure(candidate)
                return True
            except OutOfMemoryAtBatchSize:
                self.notes.append(
                    f"Batch size {candidate} ran out of memory; probing a smaller one instead: stay below it on this "
                    "device."
                )
                candidate = (self.user_batch_size + candidate) // 2
            except UserCodeError as error:
                self.fails(candidate, error)
                return False
        return False

    def _largest_predicted_to_fit(self, batch_size: int) -> int:
        if len(self.memory) < 2:
            return batch_size
        model = fit_peak_memory(list(self.memory), list(self.memory.values()))
        largest = model.largest_within(self.usable)
        return batch_size if largest is None else min(batch_size, largest)

    def _measure(self, batch_size: int) -> None:
        self._tried.add(batch_size)
        phase, fraction = f"measuring the memory of batch size {batch_size}", 0.4 + 0.1 * len(self.memory)
        self.memory[batch_size] = self.memory_of(batch_size, phase, fraction)

    def memory_of(
        self, batch_size: int, phase: str, fraction: float, measure: MeasureMemory | None = None
    ) -> MemoryProfile:
        """The memory of `batch_size`: known (`known`), else measured by `measure` (`measure_memory`
        unless given), the progress saying so with `phase` and `fraction`."""
        profile = self.known(batch_size)
        if profile is None:
            self.progress(phase, fraction)
            profile = (measure or self.measure_memory)(batch_size)
        return profile
