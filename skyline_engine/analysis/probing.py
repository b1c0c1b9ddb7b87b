"""Choosing the batch sizes to measure for the batch-size models, around the user's, OOM-aware.

The user's batch size is measured first (it must fit: it is what they train with), then half of
it, then twice it. Before a larger probe, the peak-memory model of the samples so far says whether
it would fit; a probe that runs out of memory anyway narrows the range (halfway back towards the
user's batch size) and never ends the analysis.
"""

from __future__ import annotations

from typing import Callable

from skyline_engine.measure.iteration import OutOfMemoryAtBatchSize, Sample
from skyline_engine.predict.peak_memory import fit_peak_memory

PROBES = 3
# Each out-of-memory probe costs an iteration; after this many, larger batch sizes are abandoned.
LARGER_ATTEMPTS = 3

Progress = Callable[[str, float], None]
Measure = Callable[[int], Sample]


def announce(progress: Progress, batch_size: int, done: int) -> None:
    """The progress phase of measuring the (done+1)-th batch size."""
    progress(f"measuring batch size {batch_size} ({done + 1}/{PROBES})", done / PROBES)


class Probing:
    def __init__(self, measure: Measure, usable_memory_bytes: int, progress: Progress, users: Sample) -> None:
        self.measure = measure
        self.usable = usable_memory_bytes
        self.progress = progress
        self.samples: list[Sample] = [users]
        self.notes: list[str] = []
        self._tried: set[int] = {users.batch_size}

    def measure_others(self) -> list[Sample]:
        """Up to PROBES-1 more batch sizes around the user's; all samples, by batch size."""
        user_batch_size = self.samples[0].batch_size
        self._try(max(1, user_batch_size // 2))
        if not self._try_larger(user_batch_size, 2 * user_batch_size):
            self._try(max(1, user_batch_size // 4))
        for extra in (3 * user_batch_size, 4 * user_batch_size):
            if len(self.samples) >= PROBES:
                break
            self._try_larger(user_batch_size, extra)
        return sorted(self.samples, key=lambda s: s.batch_size)

    def _try(self, batch_size: int) -> bool:
        if len(self.samples) >= PROBES or batch_size in self._tried:
            return False
        try:
            self._measure(batch_size)
            return True
        except OutOfMemoryAtBatchSize:
            self.notes.append(f"Batch size {batch_size} ran out of memory; it is left out of the models.")
            return False

    def _try_larger(self, user_batch_size: int, batch_size: int) -> bool:
        """Measure a batch size above the user's, lowered to what is predicted to fit and halved
        towards the user's on out-of-memory."""
        candidate = self._largest_predicted_to_fit(batch_size)
        for _ in range(LARGER_ATTEMPTS):
            if candidate <= user_batch_size or candidate in self._tried or len(self.samples) >= PROBES:
                return False
            try:
                self._measure(candidate)
                return True
            except OutOfMemoryAtBatchSize:
                self.notes.append(f"Batch size {candidate} ran out of memory; probing a smaller one instead.")
                candidate = (user_batch_size + candidate) // 2
        return False

    def _largest_predicted_to_fit(self, batch_size: int) -> int:
        if len({s.batch_size for s in self.samples}) < 2:
            return batch_size
        memory = fit_peak_memory([s.batch_size for s in self.samples], [s.memory for s in self.samples])
        largest = memory.largest_within(self.usable)
        return batch_size if largest is None else min(batch_size, largest)

    def _measure(self, batch_size: int) -> None:
        self._tried.add(batch_size)
        announce(self.progress, batch_size, len(self.samples))
        self.samples.append(self.measure(batch_size))
