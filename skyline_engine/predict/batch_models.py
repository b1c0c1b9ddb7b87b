"""Predicting iteration time, throughput and peak memory at any batch size.

Two straight lines fitted to the measured samples: run time (ms) against batch size, and peak
memory (bytes) against batch size, as Skyline does. Throughput follows from the run-time line:
samples/s = batch_size / run_time(batch_size) * 1000.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from skyline_engine.predict.linear import LinearModel, fit_line

# Memory kept free when deciding what fits: the device needs some for itself (CUDA context,
# allocator fragmentation, the interpreter on CPU), which a tensor-level peak does not show.
MEMORY_HEADROOM_FRACTION = 0.10

# Below this R² a model's predictions are flagged as unreliable.
POOR_FIT_R2 = 0.95
# Beyond this multiple of the largest measured batch size, the largest that fits is a far
# extrapolation (the default example on a 24 GiB CPU: 22 million, 86,000× the largest measured).
FAR_EXTRAPOLATION = 16


def usable_memory_bytes(capacity_bytes: int, headroom_fraction: float = MEMORY_HEADROOM_FRACTION) -> int:
    """What a batch size may use of the device's memory: all of it but the headroom."""
    return int(capacity_bytes * (1.0 - headroom_fraction))


@dataclass(frozen=True)
class Prediction:
    batch_size: int
    run_time_ms: float
    samples_per_second: float | None
    peak_memory_bytes: float
    fits: bool

    def to_dict(self) -> dict[str, Any]:
        return {
            "batch_size": self.batch_size,
            "run_time_ms": self.run_time_ms,
            "samples_per_second": self.samples_per_second,
            "peak_memory_bytes": self.peak_memory_bytes,
            "fits": self.fits,
        }


@dataclass(frozen=True)
class BatchSizeModels:
    run_time: LinearModel
    peak_memory: LinearModel
    memory_capacity_bytes: int
    # The models are not trusted below the smallest measured batch size: there a line with a
    # negative bias would predict times near zero and absurd throughput.
    smallest_measured_batch_size: int
    largest_measured_batch_size: int
    headroom_fraction: float = MEMORY_HEADROOM_FRACTION

    @classmethod
    def fit(
        cls, batch_sizes: Sequence[int], run_times_ms: Sequence[float], peaks: Sequence[int], capacity: int
    ) -> BatchSizeModels:
        return cls(
            fit_line(batch_sizes, run_times_ms),
            fit_line(batch_sizes, peaks),
            capacity,
            min(batch_sizes),
            max(batch_sizes),
        )

    @classmethod
    def from_dict(cls, models: dict[str, Any], memory_capacity_bytes: int) -> BatchSizeModels:
        """The models again from an analysis document's `models` (the inverse of `to_dict`, given the
        document's `device.memory_capacity_bytes`), so predictions need no new measurement.
        Raises KeyError, TypeError or ValueError when `models` is not such a dict."""
        return cls(
            run_time=_line_from_dict(models["run_time_ms"]),
            peak_memory=_line_from_dict(models["peak_memory_bytes"]),
            memory_capacity_bytes=int(memory_capacity_bytes),
            smallest_measured_batch_size=min(int(s["batch_size"]) for s in models["samples"]),
            largest_measured_batch_size=max(int(s["batch_size"]) for s in models["samples"]),
            headroom_fraction=float(models.get("memory_headroom_fraction", MEMORY_HEADROOM_FRACTION)),
        )

    @property
    def usable_memory_bytes(self) -> int:
        return usable_memory_bytes(self.memory_capacity_bytes, self.headroom_fraction)

    def predict(self, batch_size: int) -> Prediction:
        run_time = self.run_time(batch_size)
        throughput = batch_size / run_time * 1000.0 if run_time > 0 else None
        memory = self.peak_memory(batch_size)
        return Prediction(batch_size, run_time, throughput, memory, memory <= self.usable_memory_bytes)

    def max_batch_size(self) -> int | None:
        """The largest batch size predicted to fit in usable memory; None when memory does not grow
        with the batch size (nothing bounds it), 0 when not even one sample fits."""
        crossing = self.peak_memory.inverse(self.usable_memory_bytes)  # None only for a flat line
        if self.peak_memory.slope <= 0 or crossing is None:
            return None
        return max(math.floor(crossing), 0)

    def asymptotic_samples_per_second(self) -> float | None:
        """Throughput as the batch size grows without bound (Skyline's "predicted maximum")."""
        return 1000.0 / self.run_time.slope if self.run_time.slope > 0 else None

    def best_batch_size(self) -> int | None:
        """The batch size with the highest predicted throughput among those that fit, from the
        smallest measured one up. Throughput = b / (slope·b + bias) is monotone in b: it rises
        with b when the bias is positive (fixed costs get shared) and falls when it is negative.
        None when no upper bound exists (then the asymptote is the answer) or nothing fits."""
        largest = self.max_batch_size()
        if largest is None or largest < 1 or self.run_time.slope <= 0:
            return None
        if self.run_time.bias >= 0:
            return largest
        return min(self.smallest_measured_batch_size, largest)

    def predicted_max_samples_per_second(self) -> float | None:
        """The best throughput reachable within device memory (see `best_batch_size`)."""
        best = self.best_batch_size()
        if best is not None:
            return self.predict(best).samples_per_second
        if self.max_batch_size() is None and self.run_time.bias >= 0:
            return self.asymptotic_samples_per_second()
        return None

    def warnings(self) -> list[str]:
        notes = []
        for what, model in (("run-time", self.run_time), ("peak-memory", self.peak_memory)):
            if model.r2 is None:
                notes.append(
                    f"The {what} model rests on {model.points} batch sizes only, so its fit cannot be checked."
                )
            elif model.r2 < POOR_FIT_R2:
                notes.append(
                    f"The {what} model fits the measurements poorly (R² = {model.r2:.2f}); "
                    "its predictions are unreliable."
                )
        largest = self.max_batch_size()
        if largest is not None and largest > FAR_EXTRAPOLATION * self.largest_measured_batch_size:
            notes.append(
                f"The largest batch size predicted to fit ({largest:,}) is "
                f"{largest / self.largest_measured_batch_size:,.0f}× the largest measured "
                f"({self.largest_measured_batch_size:,}): the lines are extrapolated far beyond the "
                "measurements, where caches, the allocator and the machine can bend them."
            )
        if self.run_time.slope <= 0:
            notes.append(
                "Iteration time did not grow with the batch size over the measured range, "
                "so throughput predictions beyond it are unreliable."
            )
        elif self.run_time.bias < 0:
            notes.append(
                "Iteration time grows faster than the batch size over the measured range (the run-time "
                "line has a negative intercept), so throughput is predicted to fall at larger batch sizes."
            )
        return notes

    def to_dict(self) -> dict[str, Any]:
        return {
            "run_time_ms": self.run_time.to_dict(),
            "peak_memory_bytes": self.peak_memory.to_dict(),
            "memory_headroom_fraction": self.headroom_fraction,
            "usable_memory_bytes": self.usable_memory_bytes,
            "max_batch_size": self.max_batch_size(),
            "best_batch_size": self.best_batch_size(),
            "predicted_max_samples_per_second": self.predicted_max_samples_per_second(),
            "asymptotic_samples_per_second": self.asymptotic_samples_per_second(),
        }


def _line_from_dict(line: dict[str, Any]) -> LinearModel:
    r2 = line.get("r2")
    return LinearModel(
        slope=float(line["slope"]),
        bias=float(line["bias"]),
        r2=None if r2 is None else float(r2),
        max_relative_residual=float(line.get("max_relative_residual", 0.0)),
        points=int(line.get("points", 0)),
    )


def prediction_ladder(batch_size: int, measured: Sequence[int], largest: int | None) -> list[int]:
    """Batch sizes worth showing: the user's, every measured one, powers of two from the smallest
    measured up to 16 times the user's, and the largest that fits; none above the largest that
    fits but the user's and the measured ones."""
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
    return sorted(s for s in sizes if largest is None or s <= largest or s == batch_size or s in measured)
