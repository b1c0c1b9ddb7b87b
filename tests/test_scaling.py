"""The DDP scaling model: ring all-reduce cost, link fitting, bucket simulation, predicted rows."""

from __future__ import annotations

import pytest

from skyline_engine.predict.scaling import (
    DEFAULT_MAX_WORLD_SIZE,
    BucketTiming,
    Link,
    ScalingRow,
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
