"""Predicting an iteration's peak memory at any batch size, from its memory profiles.

The peak is not one straight line through the measured peaks. At each operation, the tensors
alive are a sum of sizes that are each either fixed (weights, gradients, optimizer state) or
proportional to the batch size (activations), so the bytes alive at one operation are a line in
the batch size; the peak is the highest of those lines, and which operation holds it changes with
the batch size. On an optimizer-dominated model (Adam over wide layers) the peak sits in the
optimizer step at small batch sizes and hardly grows, and in the backward pass at large ones: one
line through the peaks at 16, 32 and 64 predicted a largest batch size 9 times too large, while
the highest of the per-operation lines is exact there.

Some tensors grow with the square of the batch size: a contrastive loss (CLIP, SimCLR, in-batch
negatives) compares every sample with every other, a batch × batch matrix. Lines through a CLIP
iteration's operations missed its measured peaks by 58 % and put the largest batch size that fits
6 times too high. So an operation whose bytes a line misses, where four batch sizes or more were
measured, gets a quadratic when that reproduces all of them (memory is counted exactly: the fourth
batch size checks the three coefficients). With three, the quadratic through them is kept aside,
unchecked, for the probes to decide whether a fourth batch size is worth measuring. On CUDA the
allocator's counts stray from the tensors' bytes (unsplit cached blocks, up to 1 MiB each; a
kernel's scratch space, sized per shape), so there the tolerance is wider and the bytes held after
each operation must need the quadratic too (measure/memory.py).

So each operation's bytes are fitted with a curve over the measured batch sizes, and the peak at
batch size b is the upper envelope: the maximum over those curves. Only the curves that are the
maximum at some whole batch size matter (a few, usually); they are kept, each named by the phase
of the iteration its operation belongs to. When the operations differ between batch sizes
(control flow that depends on the batch size), one line per phase, through the phase's peaks,
stands in.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # a type alone: the service reads models from documents without torch
    from skyline_engine.measure.memory import MemoryProfile

PER_OPERATION = "per_operation"
PER_PHASE = "per_phase"
# An operation's bytes are on a line (or a quadratic) when it misses none of them by more than
# this share of how much they grow over the batch sizes measured (not of the bytes themselves:
# weights, or any tensor alive before the iteration, would hide a curve under a large baseline).
EXACT_SHARE = 0.01
# Nor by less than this: CUDA's caching allocator rounds every block up to 512 bytes, and a line
# missed by a few bytes (a shape computed with an integer division) is no curve either.
ROUNDING_BYTES = 512
# Coefficients this share (of the largest of their kind) apart are one: least squares rounds in
# the last digits (10 and 10.00000000000001), and a curve a rounding above another "overtakes" it
# at 10^16 samples.
ROUNDING_SHARE = 1e-9
# A quadratic has three coefficients: it is checked only by a fourth batch size.
QUADRATIC_POINTS = 4


@dataclass(frozen=True)
class PhaseCurve:
    """bytes = quadratic * batch_size² + slope * batch_size + bias, at one operation (or one phase)
    of the iteration, named by the phase it belongs to (the document's
    `models.peak_memory_bytes.phases[]`); `quadratic` is 0 but where tensors grow with the batch
    size squared."""

    name: str  # the phase of the iteration: vocabulary.FORWARD_BACKWARD, OPTIMIZER or OTHER
    slope: float
    bias: float
    r2: float | None  # None with two batch sizes: a line through two points cannot be judged
    quadratic: float = 0.0

    def __call__(self, batch_size: float) -> float:
        return (self.quadratic * batch_size + self.slope) * batch_size + self.bias

    @property
    def steepness(self) -> tuple[float, float]:
        """How the curve ranks at ever larger batch sizes: the steeper holds on a tie."""
        return self.quadratic, self.slope

    def largest_within(self, limit_bytes: float) -> float | None:
        """The batch size beyond which the curve exceeds `limit_bytes`; None when it never does."""
        if self.quadratic > 0:
            # The larger root of quadratic·b² + slope·b + (bias − limit) = 0 (the curve is convex).
            c = self.bias - limit_bytes
            discriminant = self.slope * self.slope - 4 * self.quadratic * c
            return (-self.slope + math.sqrt(max(discriminant, 0.0))) / (2 * self.quadratic)
        if self.slope > 0:
            return (limit_bytes - self.bias) / self.slope
        return None

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "slope": self.slope, "bias": self.bias, "r2": self.r2, "quadratic": self.quadratic}


@dataclass(frozen=True)
class PeakMemoryModel:
    phases: tuple[PhaseCurve, ...]  # the upper envelope at whole batch sizes >= 1, by where each first holds
    fitted: str  # PER_OPERATION or PER_PHASE
    points: int  # batch sizes measured
    max_relative_residual: float  # of the envelope against the measured peaks
    # Quadratics through three batch sizes where a line misses an operation's bytes: unchecked (a
    # fourth would check them), so not in the envelope; what the peak may become (analysis/probing.py).
    unchecked: tuple[PhaseCurve, ...] = ()

    def __call__(self, batch_size: float) -> float:
        return max(curve(batch_size) for curve in self.phases)

    @property
    def quadratic(self) -> bool:
        """Whether some of the peak grows with the square of the batch size."""
        return any(curve.quadratic > 0 for curve in self.phases)

    def may_rise_above(self, batch_size: float, share: float) -> bool:
        """Whether an unchecked quadratic exceeds the predicted peak at `batch_size` by more than
        `share` of it: then the lines' prediction there is not to be trusted unmeasured."""
        return any(curve(batch_size) > (1 + share) * self(batch_size) for curve in self.unchecked)

    def phase_at(self, batch_size: float) -> PhaseCurve:
        """The curve that holds the peak at `batch_size` (the steeper one on a tie)."""
        return max(self.phases, key=lambda curve: (curve(batch_size), curve.steepness))

    def segments(self, up_to: int | None = None) -> list[tuple[int, int | None, PhaseCurve]]:
        """Which curve holds the peak at which whole batch sizes: `(first, last, curve)` in order,
        `last` None for the one that holds from `first` on (the last, or the one holding at
        `up_to`: nearly parallel lines can cross at 10^12, beyond anything that fits). A curve
        overtaken between two whole batch sizes holds at none; one that a steeper line overtakes
        for a while and that takes over again (a quadratic) holds twice."""
        points = _where_the_holder_may_change(self.phases)
        if up_to is not None and up_to >= 1:
            points = [b for b in points if b <= up_to] or [1]
        # Every curve at every point at once (a curve's terms: b², b, 1); of equal values the
        # first, so the curves go steepest first, as phase_at breaks ties.
        by_steepness = sorted(self.phases, key=lambda curve: curve.steepness, reverse=True)
        coefficients = np.array([(curve.quadratic, curve.slope, curve.bias) for curve in by_steepness])
        at = np.array(points, dtype=np.float64)
        values = np.stack([at * at, at, np.ones_like(at)], axis=1) @ coefficients.T
        segments: list[tuple[int, PhaseCurve]] = []
        for b, index in zip(points, values.argmax(axis=1)):
            holder = by_steepness[index]
            if not segments or segments[-1][1] is not holder:
                segments.append((b, holder))
        ends: list[int | None] = [start - 1 for start, _ in segments[1:]]
        return [(start, end, holder) for (start, holder), end in zip(segments, [*ends, None])]

    def largest_within(self, limit_bytes: float) -> int | None:
        """The largest batch size whose predicted peak is within `limit_bytes`: None when no curve
        grows with the batch size (nothing bounds it), 0 when not even batch size 1 fits."""
        if self(1) > limit_bytes:
            return 0
        # Each curve is below the limit from 1 up to where it crosses it (a quadratic is convex).
        limits = [limit for curve in self.phases if (limit := curve.largest_within(limit_bytes)) is not None]
        if not limits:
            return None
        # The crossing of a fitted curve lands a rounding error off a whole batch size (449.9999…
        # for a peak that is exactly the limit at 450): the whole batch size is judged by the peak
        # predicted there, within half a byte, as every other prediction is.
        largest = max(1, math.floor(min(limits)))
        return largest + 1 if self(largest + 1) <= limit_bytes + 0.5 else largest

    def to_dict(self, max_batch_size: int | None, largest_measured: int) -> dict[str, Any]:
        """The document's `models.peak_memory_bytes`: the envelope's curves, and as `slope`, `bias`,
        `quadratic` and `r2` the curve that decides the largest batch size that fits (the one
        holding the peak at the largest measured batch size when nothing bounds it)."""
        deciding = self.phase_at(max_batch_size if max_batch_size else largest_measured)
        return {
            "slope": deciding.slope,
            "bias": deciding.bias,
            "quadratic": deciding.quadratic,
            "r2": deciding.r2,
            "max_relative_residual": self.max_relative_residual,
            "points": self.points,
            "fitted": self.fitted,
            "phases": [curve.to_dict() for curve in self.phases],
            "phase_at_max_batch_size": deciding.name if max_batch_size else None,
        }

    @classmethod
    def from_dict(cls, fields: Mapping[str, Any]) -> PeakMemoryModel:
        """The model again from a document's `models.peak_memory_bytes` (the inverse of to_dict).
        Raises KeyError, TypeError or ValueError when it is not such a dict."""
        phases = tuple(
            PhaseCurve(
                str(p["name"]),
                float(p["slope"]),
                float(p["bias"]),
                _optional_float(p.get("r2")),
                float(p.get("quadratic", 0.0)),  # absent from documents of lines only
            )
            for p in fields["phases"]
        )
        if not phases:
            raise ValueError("a peak-memory model has at least one curve")
        return cls(phases, str(fields["fitted"]), int(fields["points"]), float(fields["max_relative_residual"]))


def fit_peak_memory(batch_sizes: Sequence[int], profiles: Sequence[MemoryProfile]) -> PeakMemoryModel:
    """The envelope of per-operation curves through `profiles` measured at `batch_sizes` (at least
    two distinct); per phase when the profiles' operations differ."""
    if len(set(batch_sizes)) < 2:
        raise ValueError("the peak-memory model needs at least two distinct batch sizes")
    first = profiles[0]
    aligned = all(p.operation_names == first.operation_names and p.phase_starts == first.phase_starts for p in profiles)
    if aligned:
        columns = [[p.start_bytes, *p.operation_bytes] for p in profiles]
        held = [[p.start_bytes, *p.held_bytes] for p in profiles]
        phases = [first.phase_starts[0][1], *first.phases()]
        fitted = PER_OPERATION
    else:
        names = sorted({phase for p in profiles for _, phase in p.phase_starts})
        peaks = [_phase_peaks(p) for p in profiles]
        # A phase missing at some batch size gets that batch size's overall peak: never lower.
        columns = [[peak.get(name, p.peak_bytes) for name in names] for peak, p in zip(peaks, profiles)]
        phases = names
        fitted = PER_PHASE
    x, y = np.asarray(batch_sizes, dtype=np.float64), np.asarray(columns, dtype=np.float64)
    if fitted == PER_OPERATION:
        slack = max(p.count_slack_bytes for p in profiles)
        curves, unchecked = _fit_curves(x, y, np.asarray(held, dtype=np.float64), phases, slack)
    else:
        curves, unchecked = _fit_lines(x, y, phases), []
    envelope = _upper_envelope(curves)
    measured = [max(line(b) for line in envelope) for b in batch_sizes]
    residuals = [abs(m - p.peak_bytes) / p.peak_bytes for m, p in zip(measured, profiles) if p.peak_bytes]
    return PeakMemoryModel(
        tuple(envelope), fitted, len(batch_sizes), max(residuals, default=0.0), tuple(_undominated(unchecked))
    )


def _phase_peaks(profile: MemoryProfile) -> dict[str, int]:
    peaks: dict[str, int] = {}
    for phase, size in zip(profile.phases(), profile.operation_bytes):
        peaks[phase] = max(peaks.get(phase, 0), size)
    return peaks


def _fit_curves(
    x: np.ndarray, y: np.ndarray, held: np.ndarray, phases: Sequence[str], slack: int
) -> tuple[list[PhaseCurve], list[PhaseCurve]]:
    """A line through each column of `y` (samples × columns) against `x`, or a quadratic where the
    line misses and a quadratic, checked by a fourth batch size or more, does not. And the
    unchecked: with three batch sizes, the upward quadratics through the columns the lines miss.
    `held`: the same bytes without kernels' scratch space (the same as `y` on the CPU); `slack`:
    how far the count may stray from the tensors' bytes (MemoryProfile.count_slack_bytes)."""
    lines = _fit_lines(x, y, phases)
    distinct = len(np.unique(x))
    if distinct < QUADRATIC_POINTS - 1:
        return lines, []
    # Where only a kernel's scratch space leaves the line (cuDNN picks another algorithm, with a
    # larger workspace, at a larger shape: on an H200 the CNN example's convolution backward took
    # 24 MiB of it at 192 samples and 58 MiB at 256), no tensor grows with the batch size squared:
    # the line stays, and the residual says how far off it is.
    missed = ~_on_lines(x, y, slack) & ~_on_lines(x, held, slack)
    if not missed.any():
        return lines, []
    # Coefficients of the batch size scaled to at most 1, so that b² and 1 are of like size.
    scale = float(x.max())
    design = np.stack([(x / scale) ** 2, x / scale, np.ones_like(x)], axis=1)
    (a, s, c), *_ = np.linalg.lstsq(design, y[:, missed], rcond=None)
    quadratic, slope = a / scale**2, s / scale
    fitted = np.outer(x**2, quadratic) + np.outer(x, slope) + c
    checked = distinct >= QUADRATIC_POINTS
    holds = (quadratic > 0) & (_within_tolerance(y[:, missed], fitted, slack) if checked else False)
    r2 = _r2(y[:, missed], fitted)
    curves, unchecked = list(lines), []
    for column, index in enumerate(int(i) for i in np.flatnonzero(missed)):
        curve = PhaseCurve(phases[index], float(slope[column]), float(c[column]), r2[column], float(quadratic[column]))
        if holds[column]:
            curves[index] = curve
        elif not checked and curve.quadratic > 0:
            unchecked.append(curve)
    return curves, unchecked


def _on_lines(x: np.ndarray, y: np.ndarray, slack: int) -> np.ndarray:
    """Per column of `y`, whether its least-squares line against `x` is within the tolerance."""
    design = np.stack([x, np.ones_like(x)], axis=1)
    coefficients, *_ = np.linalg.lstsq(design, y, rcond=None)
    return _within_tolerance(y, design @ coefficients, slack)


def _within_tolerance(y: np.ndarray, fitted: np.ndarray, slack: int) -> np.ndarray:
    """Per column, whether `fitted` misses no sample by more than EXACT_SHARE of how much the
    column's bytes grow over the samples, nor by more than ROUNDING_BYTES or `slack`."""
    tolerance = np.maximum(EXACT_SHARE * (y.max(axis=0) - y.min(axis=0)), max(ROUNDING_BYTES, slack))
    within: np.ndarray = (np.abs(y - fitted) <= tolerance).all(axis=0)
    return within


def _fit_lines(x: np.ndarray, y: np.ndarray, phases: Sequence[str]) -> list[PhaseCurve]:
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
        r2 = list(_r2(y, np.outer(x, slopes) + biases))
    return [PhaseCurve(phase, float(s), float(b), r) for phase, s, b, r in zip(phases, slopes, biases, r2)]


def _r2(y: np.ndarray, fitted: np.ndarray) -> list[float]:
    """Per column, the coefficient of determination of `fitted` against `y`."""
    residual = ((y - fitted) ** 2).sum(axis=0)
    total = ((y - y.mean(axis=0)) ** 2).sum(axis=0)
    # Rounding leaves a residual of ~1e-20 where every sample holds the same bytes: below this, a
    # residual or a spread is none.
    none = 1e-12 * (y**2).sum(axis=0) + 1e-9
    with np.errstate(divide="ignore", invalid="ignore"):
        values = np.where(total > none, 1.0 - residual / total, np.where(residual > none, 0.0, 1.0))
    return [float(v) for v in values]


def _upper_envelope(curves: list[PhaseCurve]) -> list[PhaseCurve]:
    """The curves that hold the peak at some whole batch size >= 1, by where each first holds.

    The lines' envelope is found exactly, and cheaply, first (there is one line per operation:
    thousands); a quadratic below another in all three coefficients never holds. What remains,
    a few curves, is swept at every whole batch size where two of them may cross."""
    lines = _lines_envelope([curve for curve in curves if curve.quadratic == 0])
    quadratics = _undominated([curve for curve in curves if curve.quadratic > 0])
    if not quadratics:
        return lines
    model = PeakMemoryModel(tuple(lines + quadratics), PER_OPERATION, 0, 0.0)
    holders: list[PhaseCurve] = []
    for _, _, holder in model.segments():
        if all(holder is not known for known in holders):
            holders.append(holder)
    return holders


def _lines_envelope(lines: list[PhaseCurve]) -> list[PhaseCurve]:
    """The lines that are the maximum somewhere at batch sizes >= 1, by rising slope: from the
    highest at 1, repeatedly the steeper line that overtakes the current one first."""
    if not lines:
        return []
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


def _overtakes_at(flatter: PhaseCurve, steeper: PhaseCurve) -> float:
    """The batch size at which `steeper` (a larger slope) reaches `flatter`."""
    return (flatter.bias - steeper.bias) / (steeper.slope - flatter.slope)


def _undominated(curves: list[PhaseCurve]) -> list[PhaseCurve]:
    """The curves that no other is at least as high as in every coefficient (nowhere higher than
    it at batch sizes >= 0); of equal ones (within ROUNDING_SHARE), the first."""
    if not curves:
        return []
    coefficients = np.array([(c.quadratic, c.slope, c.bias) for c in curves])
    # Near zero (a bias of 1.7e-11 bytes against 9.1e-12), a millionth of a byte is rounding too.
    rounding = np.maximum(ROUNDING_SHARE * np.abs(coefficients).max(axis=0), 1e-6)
    kept = []
    for i, row in enumerate(coefficients):
        at_least = (coefficients >= row - rounding).all(axis=1)
        higher = at_least & (coefficients > row + rounding).any(axis=1)
        equal = (np.abs(coefficients - row) <= rounding).all(axis=1)
        equal_before = equal & (np.arange(len(curves)) < i)
        if not (higher.any() or equal_before.any()):
            kept.append(curves[i])
    return kept


def _where_the_holder_may_change(curves: Sequence[PhaseCurve]) -> list[int]:
    """1, and around every batch size above it where two curves are equal: the whole batch
    sizes from which on the curve holding the peak is constant up to the next one. At a crossing
    b the holder may change at ceil(b) (beyond it, or on the tie at a whole b) and at floor(b) + 1
    (strictly beyond a whole b)."""
    points = {1}
    for i, first in enumerate(curves):
        for second in curves[i + 1 :]:
            for crossing in _equal_at(first, second):
                if 1 < crossing < 2**62:
                    points.update((math.ceil(crossing), math.floor(crossing) + 1))
    return sorted(points)


def _equal_at(first: PhaseCurve, second: PhaseCurve) -> list[float]:
    """The real batch sizes where the two curves are equal (none where they are the same curve)."""
    a = first.quadratic - second.quadratic
    b = first.slope - second.slope
    c = first.bias - second.bias
    if a == 0:
        return [] if b == 0 else [-c / b]
    discriminant = b * b - 4 * a * c
    if discriminant < 0:
        return []
    root = math.sqrt(discriminant)
    # The form that does not cancel (b and ±root of like sign would subtract to nothing).
    q = -0.5 * (b + math.copysign(root, b))
    return [q / a, c / q] if q != 0 else [0.0]


def _optional_float(value: Any) -> float | None:
    return None if value is None else float(value)
