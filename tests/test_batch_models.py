"""Least-squares lines and the batch-size models derived from them."""

import math

import pytest

from skyline_engine.predict.batch_models import BatchSizeModels
from skyline_engine.predict.linear import fit_line


def test_fit_recovers_an_exact_line():
    line = fit_line([8, 16, 32], [2 * 8 + 5, 2 * 16 + 5, 2 * 32 + 5])
    assert line.slope == pytest.approx(2)
    assert line.bias == pytest.approx(5)
    assert line.r2 == pytest.approx(1)
    assert line.max_relative_residual == pytest.approx(0, abs=1e-12)


def test_two_points_give_no_r2_and_a_noisy_fit_a_low_one():
    assert fit_line([1, 2], [3, 5]).r2 is None
    noisy = fit_line([1, 2, 3, 4], [10, 1, 10, 1])
    assert noisy.r2 < 0.5
    assert noisy.max_relative_residual > 0.5


def test_fit_needs_two_distinct_batch_sizes():
    with pytest.raises(ValueError):
        fit_line([4, 4, 4], [1, 2, 3])


def models(run_time=(0.5, 2.0), memory=(1000.0, 50_000.0), capacity=1_000_000, measured=(8, 16, 32)):
    xs = list(measured)
    return BatchSizeModels.fit(
        xs, [run_time[0] * x + run_time[1] for x in xs], [memory[0] * x + memory[1] for x in xs], capacity
    )


def test_max_batch_size_is_the_largest_that_fits_usable_memory():
    m = models()
    usable = 1_000_000 * (1 - m.headroom_fraction)
    largest = m.max_batch_size()
    assert 1000 * largest + 50_000 <= usable < 1000 * (largest + 1) + 50_000
    assert m.predict(largest).fits and not m.predict(largest + 1).fits


def test_positive_intercept_means_the_best_throughput_is_at_the_largest_batch_size():
    m = models()
    assert m.best_batch_size() == m.max_batch_size()
    best = m.predicted_max_samples_per_second()
    assert best == pytest.approx(m.max_batch_size() / (0.5 * m.max_batch_size() + 2.0) * 1000)
    assert best < m.asymptotic_samples_per_second() == pytest.approx(2000)


def test_negative_intercept_puts_the_best_throughput_at_the_smallest_measured_batch_size():
    m = models(run_time=(0.5, -1.0))
    assert m.best_batch_size() == 8
    assert any("negative intercept" in w for w in m.warnings())


def test_memory_that_does_not_grow_leaves_the_batch_size_unbounded():
    m = models(memory=(0.0, 50_000.0))
    assert m.max_batch_size() is None
    assert m.predicted_max_samples_per_second() == pytest.approx(2000)


def test_nothing_fits_when_even_the_bias_exceeds_capacity():
    m = models(memory=(1000.0, 2_000_000.0))
    assert m.max_batch_size() == 0
    assert m.predicted_max_samples_per_second() is None


def test_a_poor_fit_is_reported_not_hidden():
    m = BatchSizeModels.fit([8, 16, 32], [5.0, 1.0, 9.0], [1e4, 2e4, 3e4], 10**9)
    assert any("fits the measurements poorly" in w for w in m.warnings())
    assert math.isfinite(m.run_time.r2)


def test_a_largest_fit_far_beyond_the_measurements_is_flagged():
    # Memory grows 1 kB a sample from 50 kB: 1 MB of capacity (less 10 % headroom) fits 850
    # samples, 26x the largest measured (32); 200 kB fits 130, 4x.
    far = models(capacity=1_000_000)
    assert far.max_batch_size() > 16 * 32
    assert any("extrapolated far beyond" in note and "(32)" in note for note in far.warnings())
    near = models(capacity=200_000)
    assert near.max_batch_size() <= 16 * 32
    assert not any("extrapolated far beyond" in note for note in near.warnings())
