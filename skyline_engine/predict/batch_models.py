"""Predicting iteration time, throughput and peak memory at any batch size.

Run time is a straight line in the batch size (ms), as Skyline fits it; throughput follows:
samples/s = micro_batches * batch_size / run_time(batch_size) * 1000 (micro_batches: 1, or k
when the iteration accumulates gradients over k micro-batches of batch_size samples). Where it
accumulates to a fixed number of samples per step (k = 256 // batch_size), the line is one
micro-batch's time and an iteration at b takes samples_per_step / b of them. Past the largest
timed batch size, where the confirming step timed batch sizes further out (the range's probe, a
suggestion: `timed_past`), the line is corrected toward them: a prediction between two of them is
read off the straight segment between them (from the line's own time at the largest timed), and one
beyond the last is the line moved by the last one's miss. Peak memory is the upper envelope of
per-operation lines (predict/peak_memory.py), not one line through the peaks.

What the models say is trusted between the smallest measured batch size and TRUSTED_FACTOR times
the largest (the largest itself where memory grows with the batch size squared): a prediction
outside says `extrapolated`. No prediction carries an impossible number:
where the run-time line is not positive, or does not grow with the batch size at all, no time and
no throughput is predicted.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from skyline_engine.predict.linear import LinearModel, fit_line
from skyline_engine.predict.peak_memory import PeakMemoryModel, fit_peak_memory
from skyline_engine.units import format_bytes

if TYPE_CHECKING:  # types alone: the service reads models from documents without torch
    from skyline_engine.measure.iteration import Sample
    from skyline_engine.measure.memory import MemoryProfile

# Memory kept free when deciding what fits: the device needs some for itself (CUDA context,
# allocator fragmentation, the interpreter on CPU), which a tensor-level peak does not show.
MEMORY_HEADROOM_FRACTION = 0.10

# Below this R² a run-time line predicts no time (a line through noise predicts noise)...
POOR_FIT_R2 = 0.95
# ... unless it comes this close to every measured time. R² weighs the misses against how much the
# time changes, so a time that barely grows (fixed costs dominate: LBFGS's Python, 13.4 ms at 64
# samples and 13.8 at 256) scores 0.93 on noise that moves no time by 0.5 %.
CLOSE_FIT_RESIDUAL = 0.01
# A run-time line that misses a measured batch size's time by more than this is said to: the time
# does not grow in a straight line there, and predictions are off by as much. (The bench's heavy
# model on a CPU: 51 ms a sample at 8 samples, 59 at 32 and 67 at 48; its line, R² 0.99, missed
# batch size 8 by 15 %. The examples' lines miss theirs by under 3 % on a quiet machine.)
CURVED_RESIDUAL = 0.10
# The same for the peak-memory model against the measured peaks. Its per-operation lines reproduce
# the examples' peaks exactly (0.0 %); an iteration that kept memory from earlier iterations (a
# leak too small to withhold the models) or allocated by the batch size in steps misses by more.
CURVED_MEMORY_RESIDUAL = 0.10
# The models suggest nothing where a timed batch size's blocks spread by more than this share of
# their mean (IQR): the line through such times, and its knee, are the machine's load. (The
# default example on a 2-core machine kept busy by other test runs, three analyses back to back:
# spreads of 11-17 % gave a knee at 467; 105-252 %, a knee at 2,841, and 1,024 measured 9.5×
# faster than 128 in rounds where 128 ran at a third of its earlier speed.) Nor does a check past
# the timed batch sizes that spread more correct the predictions (`timed_past`).
MAX_SPREAD = 0.25
# Predictions are trusted up to this multiple of the largest measured batch size.
TRUSTED_FACTOR = 4
# The throughput knee: the batch size where throughput reaches this share of its asymptote.
KNEE_SHARE = 0.9


def fits_poorly(line: LinearModel) -> bool:
    """Whether a run-time line misses the measured times (R² below POOR_FIT_R2, where it can be
    judged, and one time missed by more than CLOSE_FIT_RESIDUAL)."""
    return line.r2 is not None and line.r2 < POOR_FIT_R2 and line.max_relative_residual > CLOSE_FIT_RESIDUAL


def dividing_at_most(samples_per_step: int, batch_size: int) -> int:
    """The largest batch size up to `batch_size` that divides `samples_per_step`: an iteration that
    accumulates to a fixed number of samples a step (`256 // batch_size` micro-batches) takes them
    all only there; at 100 it would step after 200."""
    return max(d for d in _divisors(samples_per_step) if d <= batch_size)


def dividing_at_least(samples_per_step: int, batch_size: int) -> int | None:
    """The smallest batch size from `batch_size` on that divides `samples_per_step`; None past it."""
    return min((d for d in _divisors(samples_per_step) if d >= batch_size), default=None)


def _divisors(n: int) -> list[int]:
    """Every divisor of `n` (1 and `n` too), found up to its square root."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return small + [n // d for d in small]


def usable_memory_bytes(capacity_bytes: int, headroom_fraction: float = MEMORY_HEADROOM_FRACTION) -> int:
    """What a batch size may use of the device's memory: all of it but the headroom."""
    return int(capacity_bytes * (1.0 - headroom_fraction))


@dataclass(frozen=True)
class Prediction:
    batch_size: int
    run_time_ms: float | None  # None where the run-time model predicts no positive time
    samples_per_second: float | None
    peak_memory_bytes: float
    fits: bool
    extrapolated: bool  # outside the trusted range

    def to_dict(self) -> dict[str, Any]:
        return {
            "batch_size": self.batch_size,
            "run_time_ms": self.run_time_ms,
            "samples_per_second": self.samples_per_second,
            "peak_memory_bytes": self.peak_memory_bytes,
            "fits": self.fits,
            "extrapolated": self.extrapolated,
        }


@dataclass(frozen=True)
class BatchSizeModels:
    run_time: LinearModel
    peak_memory: PeakMemoryModel
    memory_capacity_bytes: int
    measured_batch_sizes: tuple[int, ...]  # timed
    memory_batch_sizes: tuple[int, ...]  # whose memory was measured: the timed ones, and more
    headroom_fraction: float = MEMORY_HEADROOM_FRACTION
    micro_batches: int = 1  # of `batch_size` samples each, per iteration (gradient accumulation)
    # Each timed batch size's measured throughput, in the order of `measured_batch_sizes` (empty
    # when not known: then the run-time line alone decides).
    measured_samples_per_second: tuple[float, ...] = ()
    failing_batch_sizes: tuple[int, ...] = ()  # probed, and the user's code failed there
    # Accumulation to a fixed number of samples per optimizer step (k = 256 // batch_size
    # micro-batches): `run_time` is then one micro-batch's time, and an iteration at batch size b
    # runs samples_per_step / b of them. None otherwise.
    samples_per_step: int | None = None
    # A batch size past the timed ones whose throughput, timed beside the user's batch size, missed
    # the run-time line's by more than the noise, below or above (predict/recommendation.py,
    # line_miss): the trusted range ends at the largest timed batch size. None where none did.
    line_bends_at: int | None = None
    # Where the trusted range would extend past the timed batch sizes, but no probe there could be
    # timed within the budget, or the probe's time spread too much to check the line: it ends at
    # the largest timed, unchecked beyond.
    range_unprobed: bool = False
    # The probe past the timed batch sizes, where it held to the run-time line short of the end the
    # timed batch sizes allow (the suggestion, or the largest the budget could time): the trusted
    # range ends there, unchecked beyond. None where no probe was timed, the line bent there, or
    # the probe reached that end.
    range_probed_to: int | None = None
    # Batch sizes timed past the largest timed one after the models were fitted (the confirming
    # step's checks, each precise to MAX_SPREAD), with their times in the line's terms (ms: one
    # micro-batch's with `samples_per_step`), in order: predictions past the largest timed follow
    # them (`run_time_at`). A check that spread more is left out: the demo's 1,024, its blocks
    # spreading 29 % with the user's beside it, put 512 at 9.4 ms where plain loops take 8.3-8.7.
    # The default example's line through 64, 128 and 256 samples said 7.5 ms at 512, between its
    # 256 (4.3 ms) and its probe at 1,024 (15.4 ms, 12 % above the line): plain loops took 8.1.
    timed_past: tuple[tuple[int, float], ...] = ()

    @classmethod
    def fit(
        cls,
        batch_sizes: Sequence[int],
        run_times_ms: Sequence[float],
        memory: Mapping[int, MemoryProfile],
        capacity: int,
        micro_batches: int = 1,
        failing: Sequence[int] = (),
        samples_per_step: int | None = None,
    ) -> BatchSizeModels:
        """Run time from the timed `batch_sizes` (with `samples_per_step`, one micro-batch's);
        peak memory from every batch size whose memory was measured (the timed ones, and
        memory-only probes beyond them)."""
        times = dict(zip(batch_sizes, run_times_ms))
        measured = tuple(sorted(times))
        return cls(
            fit_line(batch_sizes, run_times_ms),
            fit_peak_memory(list(memory), list(memory.values())),
            capacity,
            measured,
            tuple(sorted(memory)),
            micro_batches=micro_batches,
            measured_samples_per_second=tuple(micro_batches * b / times[b] * 1000.0 for b in measured),
            failing_batch_sizes=tuple(sorted(failing)),
            samples_per_step=samples_per_step,
        )

    @classmethod
    def from_dict(cls, models: dict[str, Any], memory_capacity_bytes: int) -> BatchSizeModels:
        """The models again from an analysis document's `models` (the inverse of `to_dict`, given the
        document's `device.memory_capacity_bytes`), so predictions need no new measurement.
        Raises KeyError, TypeError or ValueError when `models` is not such a dict."""
        line = models["run_time_ms"]
        r2 = line.get("r2")
        measured = sorted({int(s["batch_size"]) for s in models["samples"]})
        # Each sample's throughput; none when a sample lacks it (a document written by hand).
        rates = {int(s["batch_size"]): s.get("samples_per_second") for s in models["samples"]}
        if any(rate is None for rate in rates.values()):
            rates = {}
        return cls(
            run_time=LinearModel(
                slope=float(line["slope"]),
                bias=float(line["bias"]),
                r2=None if r2 is None else float(r2),
                max_relative_residual=float(line["max_relative_residual"]),
                points=int(line["points"]),
            ),
            peak_memory=PeakMemoryModel.from_dict(models["peak_memory_bytes"]),
            memory_capacity_bytes=int(memory_capacity_bytes),
            measured_batch_sizes=tuple(measured),
            memory_batch_sizes=tuple(
                sorted({int(s["batch_size"]) for s in [*models["samples"], *models["memory_samples"]]})
            ),
            headroom_fraction=float(models["memory_headroom_fraction"]),
            micro_batches=int(models.get("micro_batches", 1)),
            measured_samples_per_second=tuple(float(rates[b]) for b in measured) if rates else (),
            failing_batch_sizes=tuple(sorted(int(b) for b in models.get("failing_batch_sizes", []))),
            samples_per_step=None if models.get("samples_per_step") is None else int(models["samples_per_step"]),
            line_bends_at=None if models.get("line_bends_at") is None else int(models["line_bends_at"]),
            range_unprobed=bool(models.get("range_unprobed", False)),
            range_probed_to=None if models.get("range_probed_to") is None else int(models["range_probed_to"]),
        ).with_timed_past(
            (
                int(s["batch_size"]),
                float(s["run_time_ms"]),
                float(s.get("run_time_iqr_ms", 0.0)),
                int(s.get("micro_batches", 1)),
            )
            for s in models.get("checks", [])
        )

    def with_checks(self, checks: Sequence[Sample]) -> BatchSizeModels:
        """These models with the confirming step's `checks` past the largest timed batch size as
        `timed_past`."""
        return self.with_timed_past((s.batch_size, s.run_time_ms, s.timing.iqr_ms, s.micro_batches) for s in checks)

    def with_timed_past(self, checks: Iterable[tuple[int, float, float, int]]) -> BatchSizeModels:
        """These models with the `checks` (batch size, iteration ms, its IQR, micro-batches) past the
        largest timed batch size, and precise to MAX_SPREAD, as `timed_past`. With samples per step
        the line is one micro-batch's, and so is a check's time in it."""
        largest = self.measured_batch_sizes[-1]
        past = sorted(
            (batch_size, run_time_ms / micro_batches if self.samples_per_step else run_time_ms)
            for batch_size, run_time_ms, iqr_ms, micro_batches in checks
            if batch_size > largest and iqr_ms <= MAX_SPREAD * run_time_ms
        )
        return replace(self, timed_past=tuple(past))

    @property
    def usable_memory_bytes(self) -> int:
        return usable_memory_bytes(self.memory_capacity_bytes, self.headroom_fraction)

    @property
    def trusted_range(self) -> tuple[int, int]:
        """From the smallest timed batch size to TRUSTED_FACTOR times the largest, or to the
        largest itself where memory grows with the batch size squared: the operations on those
        batch × batch tensors take time that grows the same way, which the run-time line cannot
        follow (a CLIP loss's line over 256-1,024 samples said 202 ms at 4,096; it took 826).
        Never up to a batch size the user's code failed at (below the smallest timed, one is
        outside already). Where a probe past the timed batch sizes found the line bending
        (`line_bends_at`), or where none could check it (`range_unprobed`), to the largest timed;
        where the probe held to the line short of that end, to the probe (`range_probed_to`): the
        vision transformer's line through 16, 32 and 64 samples, timed each in a process of its own,
        says 12-23 % too little at 256 (bench/own_process_line.py: past 64 its blocks outgrow what
        glibc's malloc keeps, and every iteration faults them in, about 300,000 pages against
        25,000), and its probe, at 69, could not see it."""
        if self.line_bends_at or self.range_unprobed:
            high = self.measured_batch_sizes[-1]
        elif self.range_probed_to:
            high = min(self._measured_end(), self.range_probed_to)
        else:
            high = self._measured_end()
        failing = self._failing_above()
        return self.measured_batch_sizes[0], high if failing is None else min(high, failing - 1)

    def _measured_end(self) -> int:
        largest = self.measured_batch_sizes[-1]
        end = largest if self.peak_memory.quadratic else TRUSTED_FACTOR * largest
        # Past its samples per step, an iteration would run less than one micro-batch.
        return min(end, self.samples_per_step) if self.samples_per_step else end

    def _failing_above(self) -> int | None:
        """The smallest batch size above the timed ones that the user's code failed at."""
        largest = self.measured_batch_sizes[-1]
        return min((b for b in self.failing_batch_sizes if b > largest), default=None)

    @property
    def trusted_range_end(self) -> str:
        """What ends the trusted range, as a message names it."""
        end = self.trusted_range[1]
        if end + 1 in self.failing_batch_sizes:
            return f"the batch size below {end + 1}, where your code fails"
        if self.line_bends_at:
            return f"the largest measured: throughput at {self.line_bends_at} did not follow the run-time line"
        if self.range_unprobed:
            return "the largest measured: no batch size past it was timed precisely enough to check the run-time line"
        if end == self.range_probed_to:
            return f"the probe at {end}: the run-time line is unchecked past it"
        if end == self.samples_per_step:
            return "the samples per optimizer step, beyond which a step runs less than one micro-batch"
        if self.peak_memory.quadratic:
            return "the largest measured: memory grows with the batch size squared"
        return f"{TRUSTED_FACTOR}× the largest measured"

    @property
    def time_predictable(self) -> bool:
        """Whether the run-time line says anything about other batch sizes: it must grow with the
        batch size (a flat or falling line is noise, or a bottleneck elsewhere) and fit the
        measurements (fits_poorly)."""
        return self.run_time.slope > 0 and not fits_poorly(self.run_time)

    def run_time_at(self, batch_size: int) -> float:
        """The line's time at `batch_size` (ms, one micro-batch's with samples per step), corrected
        past the largest timed batch size toward what was timed there (`timed_past`): between two of
        them (the first from the line's own time at the largest timed), on the straight segment
        through them; beyond the last, the line moved by the last one's miss."""
        largest = self.measured_batch_sizes[-1]
        if not self.timed_past or batch_size <= largest:
            return self.run_time(batch_size)
        anchors = [(largest, self.run_time(largest)), *self.timed_past]
        for (low, low_ms), (high, high_ms) in zip(anchors, anchors[1:]):
            if batch_size <= high:
                return low_ms + (high_ms - low_ms) * (batch_size - low) / (high - low)
        last, last_ms = anchors[-1]
        return self.run_time(batch_size) + last_ms - self.run_time(last)

    def predict(self, batch_size: int) -> Prediction:
        low, high = self.trusted_range
        run_time: float | None = self.run_time_at(batch_size)
        if not self.time_predictable or run_time is None or run_time <= 0:
            run_time = None
        if self.samples_per_step and batch_size > self.samples_per_step:
            run_time = None  # less than one micro-batch a step: no iteration the user's code runs
        memory = self.peak_memory(batch_size)
        samples_per_second = self.micro_batches * batch_size / run_time * 1000.0 if run_time else None
        if run_time and self.samples_per_step:
            run_time *= self.samples_per_step / batch_size  # its micro-batches, one after another
        return Prediction(
            batch_size,
            run_time,
            samples_per_second,
            memory,
            memory <= self.usable_memory_bytes,
            not low <= batch_size <= high,
        )

    def max_batch_size(self) -> int | None:
        """The largest batch size predicted to fit in usable memory; None when memory does not grow
        with the batch size (nothing bounds it), 0 when not even one sample fits."""
        return self.peak_memory.largest_within(self.usable_memory_bytes)

    def max_batch_size_extrapolated(self) -> bool:
        """Whether the largest batch size that fits lies beyond TRUSTED_FACTOR times the largest
        whose memory was measured (a memory-only probe at the limit itself makes it a measured one)."""
        largest = self.max_batch_size()
        return largest is not None and largest > TRUSTED_FACTOR * self.memory_batch_sizes[-1]

    def asymptotic_samples_per_second(self) -> float | None:
        """Throughput as the batch size grows without bound (Skyline's "predicted maximum"): the
        fixed costs of an iteration shared by ever more samples. None unless time grows with the
        batch size and an iteration has fixed costs (a positive intercept)."""
        if not self.time_predictable or self.run_time.bias <= 0:
            return None
        return self.micro_batches * 1000.0 / self.run_time.slope

    def throughput_knee_batch_size(self) -> int | None:
        """The batch size where throughput reaches KNEE_SHARE of its asymptote: b / (s·b + c) =
        share / s gives b = share / (1 − share) · c / s. Beyond it, a larger batch size buys
        little throughput for its memory."""
        if self.asymptotic_samples_per_second() is None:
            return None
        return max(1, math.ceil(KNEE_SHARE / (1 - KNEE_SHARE) * self.run_time.bias / self.run_time.slope))

    def best_batch_size(self) -> int | None:
        """The batch size with the highest predicted throughput among those that fit within the
        trusted range. Throughput = b / (slope·b + bias) is monotone in b: it rises with b when
        the bias is positive (fixed costs get shared) and falls when it is negative. With samples
        per step, one that divides them (dividing_at_most). None when time does not grow with the
        batch size, or nothing fits."""
        largest = self.max_batch_size()
        high = self.trusted_range[1]
        if not self.time_predictable or largest == 0:
            return None
        if self.run_time.bias < 0:
            return self._fastest_measured(largest)
        best = min(high, largest) if largest is not None else high
        return dividing_at_most(self.samples_per_step, best) if self.samples_per_step else best

    def _fastest_measured(self, largest: int | None) -> int:
        """Where throughput falls with the batch size: the timed batch size that fits with the
        highest measured throughput (the line says the smallest, but measurements a few percent
        apart decide; recommending the smallest while the user's measured faster read "use 256,
        6% slower than yours"), else what fits below them all."""
        rates = self.measured_samples_per_second or [-b for b in self.measured_batch_sizes]  # else the smallest
        fitting = [(rate, b) for b, rate in zip(self.measured_batch_sizes, rates) if largest is None or b <= largest]
        if fitting:
            return max(fitting)[1]
        low = self.measured_batch_sizes[0]
        return low if largest is None else min(low, largest)

    def predicted_max_samples_per_second(self) -> float | None:
        """The throughput at `best_batch_size`."""
        best = self.best_batch_size()
        return self.predict(best).samples_per_second if best is not None else None

    def warnings(self) -> list[str]:
        notes = []
        r2 = self.run_time.r2
        if r2 is None:
            notes.append(
                f"The run-time model rests on {self.run_time.points} batch sizes only, so its fit cannot be checked: "
                "treat predicted times as rough, or lower the batch size (--batch-size) so that three batch "
                "sizes can be measured."
            )
        if self.run_time.slope <= 0:
            notes.append(
                "Iteration time did not grow with the batch size over the measured range, so no time or "
                "throughput is predicted at other batch sizes: re-run on a quiet machine, or profile a larger "
                "batch size (--batch-size) if the model is too small to keep the device busy."
            )
        elif r2 is not None and fits_poorly(self.run_time):
            notes.append(
                f"The run-time model fits the measurements poorly (R² = {r2:.2f}; it misses one by "
                f"{self.run_time.max_relative_residual:.0%}), even after timing them again: no time or throughput is "
                "predicted at other batch sizes. Re-run on a quiet machine."
            )
        elif self.run_time.bias < 0:
            notes.append(
                "Iteration time grows faster than the batch size over the measured range (the run-time "
                "line has a negative intercept), so throughput is predicted to fall at larger batch sizes: "
                "prefer the fastest measured batch size, and re-run on a quiet machine to confirm it."
            )
        if self.time_predictable and self.run_time.max_relative_residual > CURVED_RESIDUAL:
            notes.append(
                f"The run-time line misses one of the measured batch sizes' times by "
                f"{self.run_time.max_relative_residual:.0%}: iteration time does not grow in a straight line with "
                "the batch size here (or the machine's speed changed while they were timed), so predicted times "
                "can be off by as much between the measured batch sizes and by more beyond them."
            )
        if self.peak_memory.max_relative_residual > CURVED_MEMORY_RESIDUAL:
            notes.append(
                f"The peak-memory model misses one of the measured batch sizes' peaks by "
                f"{self.peak_memory.max_relative_residual:.0%}: memory does not grow in a straight line with the "
                "batch size here (allocations that depend on it, or memory kept from earlier iterations), so "
                "predicted peaks, and the largest batch size that fits, can be off by as much or more."
            )
        if self.peak_memory.quadratic:
            squared = max(curve.quadratic for curve in self.peak_memory.phases)
            notes.append(
                f"Peak memory grows with the square of the batch size ({format_bytes(squared)} × batch size²: a "
                "batch × batch tensor, as a loss comparing every sample with every other makes), and the time of "
                "the operations on it likely does too, which the run-time line cannot follow: predictions beyond "
                f"the largest timed batch size ({self.measured_batch_sizes[-1]:,}) are marked extrapolated."
            )
        if self.max_batch_size_extrapolated():
            largest, measured = self.max_batch_size() or 0, self.memory_batch_sizes[-1]
            notes.append(
                f"The largest batch size predicted to fit ({largest:,}) is {largest / measured:,.0f}× the "
                f"largest measured ({measured:,}): an extrapolation far beyond the measurements, where "
                "the allocator, caches and the machine can bend the lines; plan with a capacity "
                "(--memory-capacity) to get an answer nearer to them."
            )
        return notes

    def to_dict(self) -> dict[str, Any]:
        largest = self.max_batch_size()
        knee = self.throughput_knee_batch_size()
        low, high = self.trusted_range
        return {
            "run_time_ms": self.run_time.to_dict(),
            "peak_memory_bytes": self.peak_memory.to_dict(largest, self.memory_batch_sizes[-1]),
            "memory_headroom_fraction": self.headroom_fraction,
            "micro_batches": self.micro_batches,
            "samples_per_step": self.samples_per_step,
            "usable_memory_bytes": self.usable_memory_bytes,
            "max_batch_size": largest,
            "max_batch_size_extrapolated": self.max_batch_size_extrapolated(),
            "trusted_range": [low, high],
            "failing_batch_sizes": list(self.failing_batch_sizes),
            "line_bends_at": self.line_bends_at,
            "range_unprobed": self.range_unprobed,
            "range_probed_to": self.range_probed_to,
            "throughput_knee_batch_size": knee,
            "throughput_knee_samples_per_second": self.predict(knee).samples_per_second if knee else None,
            "best_batch_size": self.best_batch_size(),
            "predicted_max_samples_per_second": self.predicted_max_samples_per_second(),
            "asymptotic_samples_per_second": self.asymptotic_samples_per_second(),
        }


def prediction_ladder(
    batch_size: int, measured: Sequence[int], largest: int | None, failing: Sequence[int] = ()
) -> list[int]:
    """Batch sizes worth showing: the user's, every measured one, powers of two from the smallest
    measured up to 16 times the user's, and the largest that fits; none above the largest that
    fits but the user's and the measured ones, and none at or past a batch size the user's code
    failed at, on its side of the user's (a fails-at-16 model's chart predicted 67,095 samples/s
    at 16)."""
    smallest = min(measured)
    upper = min(largest, batch_size * 16) if largest else batch_size * 16
    sizes = {batch_size, *measured}
    step = 1
    while step <= upper:
        if step >= smallest:
            sizes.add(step)
        step *= 2
    if largest:
        sizes.add(largest)
    return sorted(
        s
        for s in sizes
        if (largest is None or s <= largest or s == batch_size or s in measured)
        and not beyond_a_failure(s, batch_size, failing)
    )


def beyond_a_failure(batch_size: int, users: int, failing: Sequence[int]) -> bool:
    """Whether `batch_size` is at or past one the user's code failed at, on the same side of the
    user's batch size `users` (a larger one past a failing one fails as well, most likely)."""
    return any(f <= batch_size if f > users else batch_size <= f for f in failing)
