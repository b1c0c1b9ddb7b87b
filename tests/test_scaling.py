"""The DDP scaling model: ring all-reduce cost, link fitting, bucket simulation, predicted rows;
and the buckets' times it is given, from traced iterations (their instants written here)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from skyline_engine.analysis.data_parallel import DataParallel
from skyline_engine.analysis.distributed import LINK_ATTEMPTS, data_parallel_notes, fit_measured_link
from skyline_engine.measure.distributed import BucketTrace, communication_timing
from skyline_engine.predict.scaling import (
    DEFAULT_MAX_WORLD_SIZE,
    BucketTiming,
    Link,
    ScalingRow,
    calibration_ms,
    efficiencies,
    fit_link,
    planned_link,
    predict_scaling,
    simulate,
)

# alpha = 0.01 ms per ring step, beta = 1000 bytes per ms: round numbers to work out by hand.
LINK = Link(latency_ms=0.01, bandwidth_bytes_per_ms=1000.0, source="measured", description="test")
# No latency: an all-reduce at W = 2 takes size / 1000 ms (2(W-1)/W = 1).
BARE = Link(latency_ms=0.0, bandwidth_bytes_per_ms=1000.0, source="measured", description="bare")


def test_all_reduce_ms_ring_formula() -> None:
    # W = 2: 2 steps * 0.01 + 2*1/2 * 1000 B / 1000 B/ms = 0.02 + 1.0
    assert LINK.all_reduce_ms(1000, 2) == pytest.approx(1.02)
    # W = 8: 14 steps * 0.01 + 2*7/8 * 1000 / 1000 = 0.14 + 1.75
    assert LINK.all_reduce_ms(1000, 8) == pytest.approx(1.89)
    assert LINK.all_reduce_ms(1000, 1) == 0.0


def test_link_to_dict_units() -> None:
    # 1.25e5 bytes/ms = 1.25e8 bytes/s = 1e9 bits/s; 0.01 ms = 10 us.
    link = Link(latency_ms=0.01, bandwidth_bytes_per_ms=1.25e5, source="measured", description="loopback")
    assert link.to_dict() == {
        "description": "loopback",
        "source": "measured",
        "latency_us": pytest.approx(10.0),
        "bandwidth_gbps": pytest.approx(1.0),
    }


def test_fit_link_recovers_alpha_beta() -> None:
    truth = Link(latency_ms=0.05, bandwidth_bytes_per_ms=2000.0, source="measured", description="x")
    measurements = [(w, size, truth.all_reduce_ms(size, w)) for w in (2, 4, 8) for size in (1000, 10_000, 100_000)]
    # A one-rank measurement has no communication and must not disturb the fit.
    measurements.append((1, 1000, 0.0))
    link = fit_link(measurements, "loopback")
    assert link.latency_ms == pytest.approx(0.05)
    assert link.bandwidth_bytes_per_ms == pytest.approx(2000.0)
    assert link.source == "measured"
    assert link.description == "loopback"


def test_fit_link_negative_latency_refits_through_zero() -> None:
    # At W = 2, x1 = 2 and x2 = size. Through (1000, 0.9) and (2000, 2.0) the line has slope
    # 1.1/1000 and intercept 0.9 - 1.1 = -0.2, so alpha = -0.1 < 0. Through zero:
    # 1/beta = (1000*0.9 + 2000*2.0) / (1000^2 + 2000^2) = 4900 / 5e6.
    link = fit_link([(2, 1000, 0.9), (2, 2000, 2.0)], "noisy")
    assert link.latency_ms == 0.0
    assert link.bandwidth_bytes_per_ms == pytest.approx(5e6 / 4900)


def test_fit_link_needs_two_ranks() -> None:
    with pytest.raises(ValueError, match="world size of 2 or more"):
        fit_link([(1, 1000, 0.5), (1, 2000, 0.7)], "single")
    with pytest.raises(ValueError):
        fit_link([], "empty")


def test_fit_link_rejects_non_positive_bandwidth() -> None:
    # Time falls as size grows: 1/beta = -1/1000, alpha = 1.5 > 0.
    with pytest.raises(ValueError, match="positive bandwidth"):
        fit_link([(2, 1000, 2.0), (2, 2000, 1.0)], "backwards")


# All-reduces as a busy machine can time them (the small one slowed past the large one), and as
# a quiet one does: 1 ms per 1000 bytes at W = 2, no latency.
BACKWARDS = [(2, 1000, 2.0), (2, 2000, 1.0)]
GROWING = [(2, 1000, 1.0), (2, 2000, 2.0)]


def measurements(*series: list[tuple[int, int, float]]) -> tuple[list[int], Callable[[], list[tuple[int, int, float]]]]:
    """A `measure` that returns `series` in turn, and the count of its calls."""
    calls = [0]

    def measure() -> list[tuple[int, int, float]]:
        calls[0] += 1
        return series[calls[0] - 1]

    return calls, measure


def alone(retry: bool) -> bool:
    return retry  # one rank: its own verdict is rank 0's


def test_a_link_that_fits_no_bandwidth_is_measured_again() -> None:
    calls, measure = measurements(BACKWARDS, GROWING)
    link = fit_measured_link(measure, "loopback", decide=alone)
    assert calls == [2]
    assert isinstance(link, Link)
    assert link.bandwidth_bytes_per_ms == pytest.approx(1000.0)


def test_a_link_that_never_fits_says_why_after_its_attempts() -> None:
    calls, measure = measurements(*[BACKWARDS] * LINK_ATTEMPTS)
    fitted = fit_measured_link(measure, "loopback", decide=alone)
    assert calls == [LINK_ATTEMPTS]
    assert isinstance(fitted, str) and "positive bandwidth" in fitted


def test_every_rank_measures_the_link_as_often_as_rank_0() -> None:
    # This rank's all-reduces fit at once, but rank 0's did not: it measures again with rank 0,
    # since each measurement is a collective every rank must join.
    calls, measure = measurements(GROWING, GROWING)
    verdicts = iter([True, False])  # rank 0: measure again, then done
    fit_measured_link(measure, "loopback", decide=lambda _mine: next(verdicts))
    assert calls == [2]


def test_without_a_fitted_link_the_notes_say_why_no_scaling_is_predicted() -> None:
    unfitted = DataParallel(2, "gloo", 1, [], [], link=None, scaling=[], backward_end_ms=0.0)
    notes = " ".join(data_parallel_notes(unfitted, link_unfitted=True))
    assert "did not take longer as they grew" in notes and "no scaling is predicted" in notes
    assert "One rank" not in notes


def test_planned_link() -> None:
    link = planned_link(100.0, LINK)
    # 100 Gbit/s = 12.5e9 bytes/s = 12.5e6 bytes/ms.
    assert link.bandwidth_bytes_per_ms == pytest.approx(12.5e6)
    assert link.latency_ms == LINK.latency_ms
    assert link.source == "user"
    assert link.description == "100 Gbit/s (planned)"


def test_simulate_bucket_hidden() -> None:
    # Ready at 5, 2000 B takes 2 ms: ends at 7, before backward ends at 10.
    buckets = [BucketTiming(index=0, size_bytes=2000, ready_ms=5.0, all_reduce_ms=2.0)]
    result = simulate(20.0, 10.0, buckets, BARE, 2, [1.0])
    assert result.exposed_ms == 0.0
    assert result.iteration_ms == 20.0


def test_simulate_bucket_overhang() -> None:
    # Ready at 9, 3000 B takes 3 ms: ends at 12, 2 ms after backward ends at 10.
    buckets = [BucketTiming(index=0, size_bytes=3000, ready_ms=9.0, all_reduce_ms=3.0)]
    result = simulate(20.0, 10.0, buckets, BARE, 2, [1.0])
    assert result.exposed_ms == pytest.approx(2.0)
    assert result.iteration_ms == pytest.approx(22.0)
    # Efficiency 2 doubles the all-reduce: 9 + 6 = 15, exposed 5.
    assert simulate(20.0, 10.0, buckets, BARE, 2, [2.0]).exposed_ms == pytest.approx(5.0)
    # One rank: no communication at all.
    assert simulate(20.0, 10.0, buckets, BARE, 1, [1.0]).exposed_ms == 0.0


def test_simulate_serializes_buckets() -> None:
    # Bucket 0: ready 2, 4 ms, ends 6. Bucket 1: ready 3 but waits for bucket 0, runs 6 to 8.
    # Backward ends at 7: exposed 1. Run in parallel, bucket 1 would end at 5 and hide entirely.
    # Listed out of order to check that bucket index, not list order, decides.
    buckets = [
        BucketTiming(index=1, size_bytes=2000, ready_ms=3.0, all_reduce_ms=2.0),
        BucketTiming(index=0, size_bytes=4000, ready_ms=2.0, all_reduce_ms=4.0),
    ]
    result = simulate(20.0, 7.0, buckets, BARE, 2, [1.0, 1.0])
    assert result.exposed_ms == pytest.approx(1.0)
    assert result.iteration_ms == pytest.approx(21.0)


def test_efficiencies_floor_at_one() -> None:
    # Model at W = 2 for 1000 B: 1.02 ms. Measured 2.04 -> 2.0; measured 0.51 -> 0.5, floored to 1.
    buckets = [
        BucketTiming(index=0, size_bytes=1000, ready_ms=0.0, all_reduce_ms=2.04),
        BucketTiming(index=1, size_bytes=1000, ready_ms=0.0, all_reduce_ms=0.51),
    ]
    assert efficiencies(buckets, LINK, 2) == [pytest.approx(2.0), 1.0]
    assert efficiencies(buckets, LINK, 1) == [1.0, 1.0]


# One bucket of 1000 B, ready at 5 ms; backward ends at 6; measured at W = 2 taking 2.04 ms,
# twice the link model's 1.02 ms, so its efficiency is 2.
SCALING_BUCKETS = [BucketTiming(index=0, size_bytes=1000, ready_ms=5.0, all_reduce_ms=2.04)]


def _predict(link: Link) -> list[ScalingRow]:
    rows = predict_scaling(
        compute_ms=20.0,
        backward_end_ms=6.0,
        buckets=SCALING_BUCKETS,
        link=link,
        batch_size_per_rank=32,
        measured_world_size=2,
        measured_samples_per_second=3000.0,
    )
    return rows


def test_predict_scaling_rows() -> None:
    rows = _predict(LINK)
    assert [row.world_size for row in rows] == [1, 2, 4, 8, 16, 32, 64]
    assert DEFAULT_MAX_WORLD_SIZE == 64

    # W = 1: no communication; 32 samples / 20 ms = 1600 samples/s.
    assert rows[0].exposed_ms == 0.0
    assert rows[0].iteration_ms == 20.0
    assert rows[0].samples_per_second == pytest.approx(1600.0)

    # W = 2: 5 + 2 * 1.02 = 7.04, 1.04 past backward; 64 samples / 21.04 ms.
    assert rows[1].exposed_ms == pytest.approx(1.04)
    assert rows[1].iteration_ms == pytest.approx(21.04)
    assert rows[1].samples_per_second == pytest.approx(64 / 21.04 * 1000)

    # W = 8: 5 + 2 * 1.89 = 8.78, 2.78 past backward.
    assert rows[3].exposed_ms == pytest.approx(2.78)

    iteration_ms = [row.iteration_ms for row in rows]
    assert iteration_ms == sorted(iteration_ms)

    assert [row.extrapolated for row in rows] == [False, False, True, True, True, True, True]
    assert [row.measured_samples_per_second for row in rows] == [None, 3000.0, None, None, None, None, None]
    assert rows[1].to_dict() == {
        "world_size": 2,
        "samples_per_second": rows[1].samples_per_second,
        "iteration_ms": rows[1].iteration_ms,
        "exposed_ms": rows[1].exposed_ms,
        "extrapolated": False,
        "measured_samples_per_second": 3000.0,
    }


def test_predict_scaling_planned_link_has_no_contention() -> None:
    # 0.008 Gbit/s = 1000 bytes/ms, latency 0.01 from the measured link: the same model as LINK,
    # but efficiency 1. W = 2: 5 + 1.02 = 6.02, 0.02 past backward (2.04 with the loopback's 2).
    planned = planned_link(0.008, LINK)
    rows = _predict(planned)
    assert rows[1].exposed_ms == pytest.approx(0.02)
    # W = 8: 5 + 1.89 = 6.89, 0.89 past backward.
    assert rows[3].exposed_ms == pytest.approx(0.89)


def test_predict_scaling_includes_measured_world_size() -> None:
    rows = predict_scaling(
        compute_ms=20.0,
        backward_end_ms=6.0,
        buckets=SCALING_BUCKETS,
        link=LINK,
        batch_size_per_rank=32,
        measured_world_size=3,
        max_world_size=8,
    )
    assert [row.world_size for row in rows] == [1, 2, 3, 4, 8]
    assert [row.extrapolated for row in rows] == [False, False, False, True, True]
    assert all(row.measured_samples_per_second is None for row in rows)


@pytest.mark.parametrize("measured_ms", [23.5, 20.5])
def test_the_prediction_at_the_measured_world_size_is_the_measurement(measured_ms: float) -> None:
    # The simulation at W = 2 takes 21.04 ms (compute 20; the bucket, ready at 5, takes 2.04 ms and
    # ends 1.04 ms past backward's end at 6). Measured above it, DDP's other synchronisation adds
    # the rest; below it, the simulation held too much (its all-reduces at least the link model's,
    # traced iterations slower than timed ones), and the difference comes off. Either way the row
    # at W = 2 is the measurement, and the other rows move by as much.
    measured = {
        "compute_ms": 20.0,
        "backward_end_ms": 6.0,
        "buckets": SCALING_BUCKETS,
        "link": LINK,
        "measured_world_size": 2,
    }
    calibration = calibration_ms(measured_iteration_ms=measured_ms, **measured)
    rows = predict_scaling(**measured, batch_size_per_rank=32, calibration_ms=calibration)
    by_size = {row.world_size: row for row in rows}
    assert by_size[1].iteration_ms == 20.0  # one rank: no communication, no calibration
    assert by_size[2].iteration_ms == pytest.approx(measured_ms)
    assert by_size[2].exposed_ms == pytest.approx(measured_ms - 20.0)
    uncalibrated = {row.world_size: row for row in predict_scaling(**measured, batch_size_per_rank=32)}
    for world_size in (4, 8, 64):  # the same difference, at every world size
        assert by_size[world_size].iteration_ms - uncalibrated[world_size].iteration_ms == pytest.approx(
            by_size[2].iteration_ms - uncalibrated[2].iteration_ms
        )
    assert [row.iteration_ms for row in rows] == sorted(row.iteration_ms for row in rows)


def test_a_calibration_never_predicts_an_iteration_faster_than_its_computation() -> None:
    # Measured at W = 4 in 20.1 ms: the simulation there is longer, so the calibration is negative,
    # and at W = 2 (less communication than at 4) it would take the iteration below its 20 ms of
    # computation without communication.
    measured = {
        "compute_ms": 20.0,
        "backward_end_ms": 6.0,
        "buckets": SCALING_BUCKETS,
        "link": LINK,
        "measured_world_size": 4,
    }
    calibration = calibration_ms(measured_iteration_ms=20.1, **measured)
    assert calibration < 0
    rows = {
        row.world_size: row for row in predict_scaling(**measured, batch_size_per_rank=32, calibration_ms=calibration)
    }
    assert rows[4].iteration_ms == pytest.approx(20.1)
    assert rows[2].iteration_ms >= 20.0 and rows[2].exposed_ms >= 0.0


def test_a_bucket_that_waited_for_the_one_before_counts_only_its_own_time() -> None:
    # Three traced iterations (ms from their start). Bucket 0 ready at 4, its all-reduce done at 10;
    # bucket 1 ready at 5, done at 11: it waited behind bucket 0 until 10, so its own time is 1,
    # not 6. In the third, bucket 1 finished alongside bucket 0 (gloo runs two at once): nothing
    # of its own.
    traces = [
        BucketTrace(0, 1000, [], ready_ms=[4.0, 4.2, 4.1], done_ms=[10.0, 10.4, 10.0]),
        BucketTrace(1, 500, [], ready_ms=[5.0, 5.0, 5.2], done_ms=[11.0, 11.2, 9.8]),
    ]
    timing = communication_timing(traces)
    assert timing.backward_end_ms == pytest.approx(5.0)
    assert [b.all_reduce_ms for b in timing.buckets] == [pytest.approx(6.0), pytest.approx(0.8)]
    assert [b.exposed_ms for b in timing.buckets] == [pytest.approx(5.0), pytest.approx(0.8)]


def test_the_simulation_reproduces_the_traced_timeline() -> None:
    # One traced iteration: bucket 0 ready at 4 and done at 10, bucket 1 ready at 5 and done at 11;
    # backward ended at 5, so 6 ms of communication were exposed. Simulated at the same world size
    # with the times measured, the iteration exposes those 6 ms (counting bucket 1 from its
    # readiness, 6 ms, the simulation started it at 10 and exposed 11).
    traces = [BucketTrace(0, 1000, [], [4.0], [10.0]), BucketTrace(1, 500, [], [5.0], [11.0])]
    timing = communication_timing(traces)
    buckets = [BucketTiming(b.index, b.size_bytes, b.ready_ms, b.all_reduce_ms) for b in timing.buckets]
    as_measured = [b.all_reduce_ms / BARE.all_reduce_ms(b.size_bytes, 2) for b in buckets]
    simulated = simulate(20.0, timing.backward_end_ms, buckets, BARE, 2, as_measured)
    assert simulated.exposed_ms == pytest.approx(6.0)
    assert simulated.exposed_ms == pytest.approx(sum(b.exposed_ms for b in timing.buckets))
