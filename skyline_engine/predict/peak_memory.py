"""Predicting an iteration's peak memory at any batch size, from its memory profiles.

The peak is not one straight line through the measured peaks. At each operation, the tensors
alive are a sum of sizes that are each either fixed (weights, gradients, optimizer state) or
proportional to the batch size (activations), so the bytes alive at one operation are a line in
the batch size; the peak is the highest of those lines, and which operation holds it changes with
the batch size. On an optimizer-dominated model (Adam over wide layers) the peak sits in the
optimizer step at small batch sizes and hardly grows, and in the backward pass at large ones: one
line through the peaks at 16, 32 and 64 predicted a largest batch size 9 times too large, while
the highest of the per-operation lines is exact there.

So each operation's bytes are fitted with a line over the measured batch sizes, and the peak at
batch size b is the upper envelope: the maximum over those lines. Only the lines that are the
maximum somewhere at b >= 1 matter (a few, usually); they are kept, each named by the phase of
the iteration its operation belongs to. When the operations differ between batch sizes (control
flow that depends on the batch size), one line per phase, through the phase's peaks, stands in.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from skyline_engine.measure.memory import MemoryProfile

PER_OPERATION = "per_operation"
PER_PHASE = "per_phase"


@dataclass(frozen=True)
class MemoryLine:
    """bytes = slope * batch_size + bias, at one operation (or one phase) of the iteration."""

    phase: str
    slope: float
    bias: float
    r2: float | None  # None with two batch sizes: a line through two points cannot be judged

    def __call__(self, batch_size: float) -> float:
        return self.slope * batch_size + self.bias

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.phase, "slope": self.slope, "bias": self.bias, "r2": self.r2}


@dataclass(frozen=True)
class PeakMemoryModel:
    lines: tuple[MemoryLine, ...]  # the upper envelope at batch sizes >= 1, by rising slope
    fitted: str  # PER_OPERATION or PER_PHASE
    points: int  # batch sizes measured
    max_relative_residual: float  # of the envelope against the measured peaks

    def __call__(self, batch_size: float) -> float:
        return max(line(batch_size) for line in self.lines)

    def line_at(self, batch_size: float) -> MemoryLine:
        """The line that holds the peak at `batch_size` (the steeper one on a tie)."""
        return max(reversed(self.lines), key=lambda line: line(batch_size))

    def held_ranges(self, up_to: int | None = None) -> list[tuple[int, int | None] | None]:
        """Per line, the whole batch sizes at which it holds the peak, `(first, last)`: `last` is
        None for the line that holds from `first` on (the steepest, or the one holding at `up_to`),
        and a line that holds at no whole batch size (overtaken between two, or only beyond
        `up_to`: nearly parallel lines can cross at 10^12) has None. The steeper line holds on a
        tie, as in `line_at`."""
        starts = [1]
        for flatter, steeper in zip(self.lines, self.lines[1:]):
            starts.append(max(starts[-1], 1, math.ceil(_overtakes_at(flatter, steeper))))
        beyond = len(starts)  # the first line that holds only beyond `up_to`
        if up_to is not None and up_to >= 1:
            beyond = next((i for i, start in enumerate(starts) if start > up_to), beyond)
        ranges: list[tuple[int, int | None] | None] = []
        for i, first in enumerate(starts[:beyond]):
            last = starts[i + 1] - 1 if i + 1 < beyond else None
            ranges.append(None if last is not None and last < first else (first, last))
        return ranges + [None] * (len(starts) - beyond)

    def largest_within(self, limit_bytes: float) -> int | None:
        """The largest batch size whose predicted peak is within `limit_bytes`: None when no line
        grows with the batch size (nothing bounds it), 0 when not even batch size 1 fits."""
        if self(1) > limit_bytes:
            return 0
        growing = [line for line in self.lines if line.slope > 0]
        if not growing:
            return None
        return max(1, min(math.floor((limit_bytes - line.bias) / line.slope) for line in growing))

    def to_dict(self, max_batch_size: int | None, largest_measured: int) -> dict[str, Any]:
        """The document's `models.peak_memory_bytes`: the envelope's lines, and as `slope`, `bias`
        and `r2` the line that decides the largest batch size that fits (the one holding the peak
        at the largest measured batch size when nothing bounds it)."""
        deciding = self.line_at(max_batch_size if max_batch_size else largest_measured)
        return {
            "slope": deciding.slope,
            "bias": deciding.bias,
            "r2": deciding.r2,
            "max_relative_residual": self.max_relative_residual,
            "points": self.points,
            "fitted": self.fitted,
            "phases": [line.to_dict() for line in self.lines],
            "phase_at_max_batch_size": deciding.phase if max_batch_size else None,
        }

    @classmethod
    def from_dict(cls, fields: dict[str, Any]) -> PeakMemoryModel:
        """The model again from a document's `models.peak_memory_bytes` (the inverse of to_dict).
        Raises KeyError, TypeError or ValueError when it is not such a dict."""
        lines = tuple(
            MemoryLine(str(p["name"]), float(p["slope"]), float(p["bias"]), _optional_float(p.get("r2")))
            for p in fields["phases"]
        )
        if not lines:
            raise ValueError("a peak-memory model has at least one line")
        return cls(lines, str(fields["fitted"]), int(fields["points"]), float(fields["max_relative_residual"]))


def fit_peak_memory(batch_sizes: Sequence[int], profiles: Sequence[MemoryProfile]) -> PeakMemoryModel:
    """The envelope of per-operation lines through `profiles` measured at `batch_sizes` (at least
    two distinct); per phase when the profiles' operations differ."""
    if len(set(batch_sizes)) < 2:
        raise ValueError("the peak-memory model needs at least two distinct batch sizes")
    first = profiles[0]
    aligned = all(p.operation_names == first.operation_names and p.phase_starts == first.phase_starts for p in profiles)
    if aligned:
        columns = [[p.start_bytes, *p.operation_bytes] for p in profiles]
        phases = [first.phase_starts[0][1], *first.phases()]
        fitted = PER_OPERATION
    else:
        names = sorted({phase for p in profiles for _, phase in p.phase_starts})
        peaks = [_phase_peaks(p) for p in profiles]
        # A phase missing at some batch size gets that batch size's overall peak: never lower.
        columns = [[peak.get(name, p.peak_bytes) for name in names] for peak, p in zip(peaks, profiles)]
        phases = names
        fitted = PER_PHASE
    lines = _fit_lines(np.asarray(batch_sizes, dtype=np.float64), np.asarray(columns, dtype=np.float64), phases)
    envelope = _upper_envelope(lines)
    measured = [max(line(b) for line in envelope) for b in batch_sizes]
    residuals = [abs(m - p.peak_bytes) / p.peak_bytes for m, p in zip(measured, profiles) if p.peak_bytes]
    return PeakMemoryModel(tuple(envelope), fitted, len(batch_sizes), max(residuals, default=0.0))


def _phase_peaks(profile: MemoryProfile) -> dict[str, int]:
    peaks: dict[str, int] = {}
    for phase, size in zip(profile.phases(), profile.operation_bytes):
        peaks[phase] = max(peaks.get(phase, 0), size)
    return peaks


def _fit_lines(x: np.ndarray, y: np.ndarray, phases: Sequence[str]) -> list[MemoryLine]:
    """Least-squares lines through each column of `y` (samples × columns) against `x`."""
    design = np.stack([x, np.ones_like(x)], axis=1)
    (slopes, biases), *_ = np.linalg.lstsq(design, y, rcond=None)
    # A column that holds the same bytes at every batch size is exactly flat: least squares leaves
    # float dust there (±1e-11 bytes a sample, which put the largest batch size that fits at
    # 3.7e19 when nothing else grew).
    flat = (y == y[0]).all(axis=0)
    slopes, biases = np.where(flat, 0.0, slopes), np.where(flat, y[0], biases)
    r2: list[float | None] = [None] * y.shape[1]
    if len(x) >= 3:
        residual = ((y - (np.outer(x, slopes) + biases)) ** 2).sum(axis=0)
        total = ((y - y.mean(axis=0)) ** 2).sum(axis=0)
        # Rounding leaves a residual of ~1e-20 where every sample holds the same bytes: below
        # this, a residual or a spread is none.
        none = 1e-12 * (y**2).sum(axis=0) + 1e-9
        with np.errstate(divide="ignore", invalid="ignore"):
            values = np.where(total > none, 1.0 - residual / total, np.where(residual > none, 0.0, 1.0))
        r2 = [float(v) for v in values]
    return [MemoryLine(phase, float(s), float(b), r) for phase, s, b, r in zip(phases, slopes, biases, r2)]


def _upper_envelope(lines: list[MemoryLine]) -> list[MemoryLine]:
    """The lines that are the maximum somewhere at batch sizes >= 1, by rising slope: from the
    highest at 1, repeatedly the steeper line that overtakes the current one first."""
    current = max(lines, key=lambda line: (line(1), line.slope))
    envelope = [current]
    at = 1.0
    while True:
        steeper = [line for line in lines if line.slope > current.slope]
        if not steeper:
            return envelope
        crossings = [(max(at, _overtakes_at(current, line)), -line.slope, i) for i, line in enumerate(steeper)]
        at, _, index = min(crossings)
        current = steeper[index]
        envelope.append(current)


def _overtakes_at(flatter: MemoryLine, steeper: MemoryLine) -> float:
    """The batch size at which `steeper` (a larger slope) reaches `flatter`."""
    return (flatter.bias - steeper.bias) / (steeper.slope - flatter.slope)


def _optional_float(value: Any) -> float | None:
    return None if value is None else float(value)
