"""Predicted DistributedDataParallel throughput at larger world sizes.

The model:

* Communication is a ring all-reduce. Over W ranks it takes 2(W-1) steps, each paying the link's
  latency (alpha), and each rank sends 2(W-1)/W of the bucket's bytes over the link's bandwidth
  (beta): ``t = 2(W-1) * alpha + 2(W-1)/W * bytes / beta``.
* DDP all-reduces gradient buckets one at a time, in bucket order, as backward makes each bucket
  ready; they overlap the rest of backward. Only the part of the last all-reduce that ends after
  backward ends is exposed, and adds to the iteration.
* Each rank keeps its batch size (weak scaling), so its compute time does not change with the
  world size; throughput is W * batch size per rank / iteration time.

An all-reduce measured inside an iteration competes with backward for the same cores and memory,
so it runs slower than the isolated link measurement predicts. That ratio (the bucket's
efficiency) is carried to larger world sizes. It is floored at 1: a measured all-reduce faster
than the link model is measurement noise, not a link that gets faster under load, and carrying
it would predict communication cheaper than the link allows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

# Gigabits per second to bytes per millisecond: 1e9 bits / 8 bits per byte / 1000 ms per second.
_BYTES_PER_MS_PER_GBPS = 1e9 / 8 / 1000

DEFAULT_MAX_WORLD_SIZE = 64


def _ring_steps(world_size: int) -> float:
    return 2.0 * (world_size - 1)


def _ring_bytes_fraction(world_size: int) -> float:
    return 2.0 * (world_size - 1) / world_size


@dataclass(frozen=True)
class Link:
    """An alpha-beta model of the link between ranks.

    `source` is "measured" (fitted to all-reduces run here) or "user" (a planned interconnect).
    """

    latency_ms: float
    bandwidth_bytes_per_ms: float
    source: str
    description: str

    def all_reduce_ms(self, size_bytes: int, world_size: int) -> float:
        """Time of one ring all-reduce of `size_bytes` over `world_size` ranks."""
        if world_size <= 1:
            return 0.0
        return (
            _ring_steps(world_size) * self.latency_ms
            + _ring_bytes_fraction(world_size) * size_bytes / self.bandwidth_bytes_per_ms
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "description": self.description,
            "source": self.source,
            "latency_us": self.latency_ms * 1000.0,
            "bandwidth_gbps": self.bandwidth_bytes_per_ms / _BYTES_PER_MS_PER_GBPS,
        }


def fit_link(measurements: Sequence[tuple[int, int, float]], description: str) -> Link:
    """Fit alpha and beta to measured all-reduces `(world_size, size_bytes, all_reduce_ms)`.

    Least squares of ``ms = alpha * 2(W-1) + (1/beta) * 2(W-1)/W * bytes``. Measurements at one
    rank carry no communication and are ignored. Measure several sizes: with a single size and
    world size the split between latency and bandwidth is undetermined, and the minimum-norm
    solution is taken.
    """
    usable = [(w, size, ms) for w, size, ms in measurements if w >= 2]
    if not usable:
        raise ValueError("fit_link needs at least one all-reduce measured at a world size of 2 or more")
    x1 = np.array([_ring_steps(w) for w, _, _ in usable], dtype=np.float64)
    x2 = np.array([_ring_bytes_fraction(w) * size for w, size, _ in usable], dtype=np.float64)
    y = np.array([ms for _, _, ms in usable], dtype=np.float64)

    solution, *_ = np.linalg.lstsq(np.column_stack([x1, x2]), y, rcond=None)
    latency_ms = float(solution[0])
    inverse_bandwidth = float(solution[1])
    if latency_ms < 0:
        # A negative latency is noise around a latency too small to resolve; a line through zero
        # keeps the model physical and lets the bandwidth absorb the fixed cost.
        latency_ms = 0.0
        denominator = float(np.dot(x2, x2))
        inverse_bandwidth = float(np.dot(x2, y)) / denominator if denominator > 0 else 0.0
    if not inverse_bandwidth > 0:
        raise ValueError(
            "fit_link: the all-reduce times do not grow with the bytes sent, so no positive bandwidth "
            "fits them; measure larger sizes"
        )
    return Link(
        latency_ms=latency_ms,
        bandwidth_bytes_per_ms=1.0 / inverse_bandwidth,
        source="measured",
        description=description,
    )


def planned_link(gbps: float, measured: Link) -> Link:
    """A user's planned interconnect of `gbps` gigabits per second.

    Its latency is the measured link's, for want of a better figure: the user names a bandwidth only.
    """
    return Link(
        latency_ms=measured.latency_ms,
        bandwidth_bytes_per_ms=gbps * _BYTES_PER_MS_PER_GBPS,
        source="user",
        description=f"{gbps:g} Gbit/s (planned)",
    )


@dataclass(frozen=True)
class BucketTiming:
    """One DDP gradient bucket as measured in an iteration.

    `ready_ms` is when backward made its gradients ready, from the start of the iteration;
    `all_reduce_ms` is its all-reduce time at the measured world size.
    """

    index: int
    size_bytes: int
    ready_ms: float
    all_reduce_ms: float


@dataclass(frozen=True)
class SimulatedIteration:
    iteration_ms: float
    exposed_ms: float


def simulate(
    compute_ms: float,
    backward_end_ms: float,
    buckets: Sequence[BucketTiming],
    link: Link,
    world_size: int,
    efficiency: Sequence[float],
) -> SimulatedIteration:
    """One iteration at `world_size`: all-reduces run one at a time, in bucket index order.

    ``start_i = max(ready_i, end_{i-1})``, ``end_i = start_i + efficiency_i * link time``; the
    communication exposed is what ends after backward does. `efficiency` is indexed like `buckets`.
    """
    if len(efficiency) != len(buckets):
        raise ValueError(f"simulate: {len(efficiency)} efficiencies for {len(buckets)} buckets")
    if world_size <= 1 or not buckets:
        return SimulatedIteration(iteration_ms=compute_ms, exposed_ms=0.0)
    end_ms = float("-inf")
    for bucket, factor in sorted(zip(buckets, efficiency), key=lambda pair: pair[0].index):
        start_ms = max(bucket.ready_ms, end_ms)
        end_ms = start_ms + factor * link.all_reduce_ms(bucket.size_bytes, world_size)
    exposed_ms = max(0.0, end_ms - backward_end_ms)
    return SimulatedIteration(iteration_ms=compute_ms + exposed_ms, exposed_ms=exposed_ms)


def efficiencies(buckets: Sequence[BucketTiming], link: Link, measured_world_size: int) -> list[float]:
    """Per bucket, measured all-reduce time / the link model's, at least 1.0.

    Floored at 1 because inside an iteration the all-reduce competes with backward: it only gets
    slower than the isolated link measurement, and a ratio below 1 is noise.
    """
    if measured_world_size < 2:
        return [1.0 for _ in buckets]
    result = []
    for bucket in buckets:
        modelled = link.all_reduce_ms(bucket.size_bytes, measured_world_size)
        result.append(max(1.0, bucket.all_reduce_ms / modelled) if modelled > 0 else 1.0)
    return result


@dataclass(frozen=True)
class ScalingRow:
    """Predicted throughput at one world size.

    `extrapolated` marks world sizes beyond the measured one; `measured_samples_per_second` is
    set on the measured world size's row only, when a measurement was given.
    """

    world_size: int
    samples_per_second: float
    iteration_ms: float
    exposed_ms: float
    extrapolated: bool
    measured_samples_per_second: float | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "world_size": self.world_size,
            "samples_per_second": self.samples_per_second,
            "iteration_ms": self.iteration_ms,
            "exposed_ms": self.exposed_ms,
            "extrapolated": self.extrapolated,
            "measured_samples_per_second": self.measured_samples_per_second,
        }


def predict_scaling(
    *,
    compute_ms: float,
    backward_end_ms: float,
    buckets: Sequence[BucketTiming],
    link: Link,
    batch_size_per_rank: int,
    measured_world_size: int,
    measured_samples_per_second: float | None = None,
    max_world_size: int = DEFAULT_MAX_WORLD_SIZE,
    calibration_ms: float = 0.0,
) -> list[ScalingRow]:
    """Throughput at the powers of two up to `max_world_size`, and at the measured world size.

    `calibration_ms` is added to every iteration of two ranks or more (never below `compute_ms`):
    what the iteration measured at the measured world size took beyond its simulation, or less
    (see `calibration_ms`)."""
    world_sizes = {1 << k for k in range(max_world_size.bit_length()) if 1 << k <= max_world_size}
    world_sizes.add(measured_world_size)
    efficiency = _efficiency(buckets, link, measured_world_size)
    rows = []
    for world_size in sorted(world_sizes):
        simulated = simulate(compute_ms, backward_end_ms, buckets, link, world_size, efficiency)
        if world_size > 1 and calibration_ms:
            iteration_ms = max(compute_ms, simulated.iteration_ms + calibration_ms)
            simulated = SimulatedIteration(iteration_ms, iteration_ms - compute_ms)
        rows.append(
            ScalingRow(
                world_size=world_size,
                samples_per_second=world_size * batch_size_per_rank / simulated.iteration_ms * 1000.0,
                iteration_ms=simulated.iteration_ms,
                exposed_ms=simulated.exposed_ms,
                extrapolated=world_size > measured_world_size,
                measured_samples_per_second=(
                    measured_samples_per_second if world_size == measured_world_size else None
                ),
            )
        )
    return rows


def calibration_ms(
    *,
    measured_iteration_ms: float,
    compute_ms: float,
    backward_end_ms: float,
    buckets: Sequence[BucketTiming],
    link: Link,
    measured_world_size: int,
) -> float:
    """The iteration measured at `measured_world_size` less its simulation: with it, the prediction
    there is the measurement. Positive where synchronising cost more than the all-reduces the
    simulation holds (DDP copying gradients into buckets, broadcasting buffers, ranks waiting for
    the slowest); negative where the simulation holds more than the iteration took (each bucket's
    all-reduce is at least the link model's, and the traced iterations ran slower than the timed
    ones)."""
    efficiency = _efficiency(buckets, link, measured_world_size)
    simulated = simulate(compute_ms, backward_end_ms, buckets, link, measured_world_size, efficiency)
    return measured_iteration_ms - simulated.iteration_ms


def _efficiency(buckets: Sequence[BucketTiming], link: Link, measured_world_size: int) -> list[float]:
    if link.source == "measured":
        return efficiencies(buckets, link, measured_world_size)
    # The measured contention belongs to the loopback link it was measured on, not to a planned
    # interconnect.
    return [1.0 for _ in buckets]
