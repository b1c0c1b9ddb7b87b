"""Least-squares lines, the peak-memory envelope and the batch-size models, on fixed measurements
(no timing is involved: the numbers are written here)."""

import dataclasses
import math

import pytest

from skyline_engine.measure.iteration import Sample
from skyline_engine.measure.memory import CUDA_COUNT_SLACK_BYTES, MemoryProfile
from skyline_engine.measure.timing import TimingStats
from skyline_engine.predict.batch_models import POOR_FIT_R2, BatchSizeModels, prediction_ladder
from skyline_engine.predict.linear import LinearModel, fit_line
from skyline_engine.predict.peak_memory import PER_OPERATION, PER_PHASE, PeakMemoryModel, PhaseCurve, fit_peak_memory
from skyline_engine.vocabulary import FORWARD_BACKWARD, OPTIMIZER

KiB, MiB = 1 << 10, 1 << 20


def test_fit_recovers_an_exact_line():
    line = fit_line([8, 16, 32], [2 * 8 + 5, 2 * 16 + 5, 2 * 32 + 5])
    assert line.slope == pytest.approx(2)
    assert line.bias == pytest.approx(5)
    assert line.r2 == pytest.approx(1)
    assert line.max_relative_residual == pytest.approx(0, abs=1e-12)


def test_identical_measurements_give_an_exactly_flat_line():
    line = fit_line([8, 16, 32], [12582912.0] * 3)  # 12 MiB at every batch size
    assert (line.slope, line.bias, line.r2, line.max_relative_residual) == (0.0, 12582912.0, 1.0, 0.0)
    assert line.inverse(2**30) is None


def test_two_points_give_no_r2_and_a_noisy_fit_a_low_one():
    assert fit_line([1, 2], [3, 5]).r2 is None
    noisy = fit_line([1, 2, 3, 4], [10, 1, 10, 1])
    assert noisy.r2 < 0.5
    assert noisy.max_relative_residual > 0.5


def test_fit_needs_two_distinct_batch_sizes():
    with pytest.raises(ValueError):
        fit_line([4, 4, 4], [1, 2, 3])


def profile(batch_size, operations, start=0):
    """The profile of an iteration whose operations hold `slope * batch_size + bias` bytes each;
    `operations` is [(phase, slope, bias), ...] in order."""
    names, sizes, starts = [], [], []
    for index, (phase, slope, bias) in enumerate(operations):
        if not starts or starts[-1][1] != phase:
            starts.append((index, phase))
        names.append(f"op{index}")
        sizes.append(int(slope * batch_size + bias))
    return MemoryProfile(start, tuple(sizes), tuple(names), tuple(starts))


# An optimizer-dominated iteration (Adam over wide layers), in miniature: 200 MiB of weights,
# gradients and state; activations of 54 KiB a sample peak in backward; the step holds 32 MiB of
# temporaries and grows 6 KiB a sample. At 16-64 samples the step sets the peak.
OPTIMIZER_DOMINATED = [
    (FORWARD_BACKWARD, 20 * KiB, 200 * MiB),
    (FORWARD_BACKWARD, 54 * KiB, 200 * MiB),
    (OPTIMIZER, 6 * KiB, 232 * MiB),
    (OPTIMIZER, 0, 216 * MiB),
]


def test_the_envelope_predicts_where_the_peak_moves_to_another_phase():
    measured = [16, 32, 64]
    model = fit_peak_memory(measured, [profile(b, OPTIMIZER_DOMINATED) for b in measured])
    assert model.fitted == PER_OPERATION
    # Only the lines that are ever the maximum are kept, by rising slope.
    assert [curve.name for curve in model.phases] == [OPTIMIZER, FORWARD_BACKWARD]
    assert [curve.slope for curve in model.phases] == pytest.approx([6 * KiB, 54 * KiB])
    crossover = 32 * MiB / (48 * KiB)  # 682.7 samples
    assert model.phase_at(600).name == OPTIMIZER and model.phase_at(700).name == FORWARD_BACKWARD
    assert model(4096) == pytest.approx(54 * KiB * 4096 + 200 * MiB)
    # With 1 GiB usable: (1 GiB - 200 MiB) / 54 KiB samples, where one line through the measured
    # peaks (6 KiB a sample) would allow 137,000.
    assert model.largest_within(1 << 30) == math.floor((824 * MiB) / (54 * KiB)) == 15625
    assert crossover < 15625
    single = fit_line(measured, [profile(b, OPTIMIZER_DOMINATED).peak_bytes for b in measured])
    assert math.floor(single.inverse(1 << 30)) > 8 * 15625


def test_operations_that_differ_between_batch_sizes_fall_back_to_a_line_per_phase():
    measured = [16, 32, 64]
    profiles = [profile(b, OPTIMIZER_DOMINATED) for b in measured]
    profiles[1] = profile(32, [*OPTIMIZER_DOMINATED, (OPTIMIZER, 0, 0)])  # one more operation
    model = fit_peak_memory(measured, profiles)
    assert model.fitted == PER_PHASE
    assert {curve.name for curve in model.phases} <= {FORWARD_BACKWARD, OPTIMIZER}
    for b, p in zip(measured, profiles):
        assert model(b) == pytest.approx(p.peak_bytes)


def test_each_line_holds_the_peak_over_the_whole_batch_sizes_it_says():
    # The optimizer's flat line up to 299; at 300 the second overtakes it (a tie: the steeper
    # holds); the third from 1400 / 3 = 466.7, so from 467.
    lines = (
        PhaseCurve(OPTIMIZER, 0.0, 1000.0, None),
        PhaseCurve(FORWARD_BACKWARD, 2.0, 400.0, None),
        PhaseCurve(FORWARD_BACKWARD, 5.0, -1000.0, None),
    )
    model = PeakMemoryModel(lines, PER_OPERATION, 3, 0.0)
    segments = model.segments()
    assert segments == [(1, 299, lines[0]), (300, 466, lines[1]), (467, None, lines[2])]
    for b in range(1, 1000):
        holder = next(curve for first, last, curve in segments if first <= b and (last is None or b <= last))
        assert model.phase_at(b) is holder, b


def test_a_line_overtaken_between_two_whole_batch_sizes_holds_at_none():
    # The second line overtakes the first at 99.5 and is overtaken by the third at 99.7.
    lines = (
        PhaseCurve(OPTIMIZER, 0.0, 100.0, None),
        PhaseCurve(FORWARD_BACKWARD, 1.0, 0.5, None),
        PhaseCurve(FORWARD_BACKWARD, 2.0, -99.2, None),
    )
    model = PeakMemoryModel(lines, PER_OPERATION, 3, 0.0)
    assert model.segments() == [(1, 99, lines[0]), (100, None, lines[2])]
    assert model.phase_at(99) is lines[0] and model.phase_at(100) is lines[2]
    assert PeakMemoryModel(lines[:1], PER_OPERATION, 3, 0.0).segments() == [(1, None, lines[0])]


def test_a_line_that_takes_over_only_beyond_the_largest_batch_size_that_fits_holds_at_none_there():
    # Two operations of a GAN's backward passes gave nearly parallel lines (3.6 KiB a sample each)
    # that cross at 2.2e12; the report said "the highest at batch sizes 39-2,199,023,255,551".
    lines = (
        PhaseCurve(OPTIMIZER, 1100.0, 367_000.0, None),
        PhaseCurve(FORWARD_BACKWARD, 3700.0, 268_900.0, None),
        PhaseCurve(FORWARD_BACKWARD, 3700.5, 268_900.0 - 1.1e12, None),
    )
    model = PeakMemoryModel(lines, PER_OPERATION, 3, 0.0)
    assert model.segments() == [
        (1, 37, lines[0]),
        (38, 2_199_999_999_999, lines[1]),
        (2_200_000_000_000, None, lines[2]),
    ]
    assert model.segments(6_030_566) == [(1, 37, lines[0]), (38, None, lines[1])]
    assert model.segments(37) == [(1, None, lines[0])]
    # The largest that fits at the very batch size where a line takes over: it holds there.
    assert model.segments(38) == [(1, 37, lines[0]), (38, None, lines[1])]
    assert model.segments(0) == model.segments()  # nothing fits: nothing to clip to


def models(run_time=(0.5, 2.0), memory=(1000.0, 50_000.0), capacity=1_000_000, measured=(8, 16, 32)):
    xs = list(measured)
    return BatchSizeModels.fit(
        xs,
        [run_time[0] * x + run_time[1] for x in xs],
        {x: profile(x, [(FORWARD_BACKWARD, *memory)]) for x in xs},
        capacity,
    )


def test_max_batch_size_is_the_largest_that_fits_usable_memory():
    m = models()
    usable = 1_000_000 * (1 - m.headroom_fraction)
    largest = m.max_batch_size()
    assert largest == 850
    assert 1000 * largest + 50_000 <= usable < 1000 * (largest + 1) + 50_000
    assert m.predict(largest).fits and not m.predict(largest + 1).fits


def test_the_throughput_knee_is_where_throughput_reaches_90_percent_of_its_limit():
    m = models()  # 0.5 ms a sample + 2 ms an iteration: at most 2,000 samples/s
    assert m.asymptotic_samples_per_second() == pytest.approx(2000)
    assert m.throughput_knee_batch_size() == 36  # 9 × 2 / 0.5
    assert m.predict(36).samples_per_second == pytest.approx(1800)
    assert m.to_dict()["throughput_knee_samples_per_second"] == pytest.approx(1800)


def test_predictions_outside_the_trusted_range_say_so():
    m = models()
    assert m.trusted_range == (8, 128)
    assert [m.predict(b).extrapolated for b in (4, 8, 128, 129)] == [True, False, False, True]
    assert m.max_batch_size_extrapolated()  # 850 > 128
    assert any("extrapolation far beyond" in note and "(32)" in note for note in m.warnings())
    near = models(capacity=150_000)  # fits 85
    assert not near.max_batch_size_extrapolated()
    assert not any("extrapolation far beyond" in note for note in near.warnings())


def test_nothing_is_trusted_from_a_batch_size_the_users_code_failed_at():
    m = dataclasses.replace(models(), failing_batch_sizes=(4, 100))
    assert m.trusted_range == (8, 99)
    assert m.trusted_range_end == "the batch size below 100, where your code fails"
    assert [m.predict(b).extrapolated for b in (99, 100)] == [False, True]
    assert m.best_batch_size() == 99  # not the 128 that time and memory alone would recommend
    written = m.to_dict() | {"samples": [{"batch_size": b} for b in (8, 16, 32)], "memory_samples": []}
    assert written["failing_batch_sizes"] == [4, 100]
    again = BatchSizeModels.from_dict(written, 1_000_000)
    assert again.failing_batch_sizes == (4, 100) and again.trusted_range == (8, 99)
    beyond = dataclasses.replace(models(), failing_batch_sizes=(200,))  # beyond 4× the largest timed
    assert beyond.trusted_range == (8, 128) and beyond.trusted_range_end == "4× the largest measured"


def test_best_throughput_stays_within_the_trusted_range():
    m = models()
    assert m.best_batch_size() == 128  # the trusted range's end, below the 850 that fit
    assert m.predicted_max_samples_per_second() == pytest.approx(128 / (0.5 * 128 + 2.0) * 1000)


def test_negative_intercept_puts_the_best_throughput_at_the_fastest_measured_batch_size():
    m = models(run_time=(0.5, -1.0))
    assert m.best_batch_size() == 8
    assert m.throughput_knee_batch_size() is None
    assert any("negative intercept" in w for w in m.warnings())


def test_no_impossible_numbers_where_the_time_line_does_not_hold():
    falling = models(run_time=(-0.2, 20.0))
    assert any("did not grow with the batch size" in w for w in falling.warnings())
    for b in (1, 8, 32, 500):
        p = falling.predict(b)
        assert p.run_time_ms is None and p.samples_per_second is None
    assert falling.best_batch_size() is None and falling.throughput_knee_batch_size() is None
    crossing_zero = models(run_time=(0.5, -10.0))  # 0 ms at 20 samples, negative below
    assert crossing_zero.predict(10).run_time_ms is None and crossing_zero.predict(10).samples_per_second is None
    assert crossing_zero.predict(32).run_time_ms == pytest.approx(6.0)


def test_memory_that_does_not_grow_leaves_the_batch_size_unbounded():
    m = models(memory=(0.0, 50_000.0))
    assert m.max_batch_size() is None
    assert not m.max_batch_size_extrapolated()
    assert m.best_batch_size() == 128


def test_nothing_fits_when_even_the_bias_exceeds_capacity():
    m = models(memory=(1000.0, 2_000_000.0))
    assert m.max_batch_size() == 0
    assert m.predicted_max_samples_per_second() is None


def test_a_poor_fit_is_reported_not_hidden():
    m = BatchSizeModels.fit(
        [8, 16, 32], [5.0, 1.0, 9.0], {b: profile(b, [(FORWARD_BACKWARD, 1e3, 1e4)]) for b in (8, 16, 32)}, 10**9
    )
    assert any("fits the measurements poorly" in w for w in m.warnings())
    assert math.isfinite(m.run_time.r2)


def test_a_time_that_barely_grows_is_predicted_when_the_line_misses_no_time_by_much():
    """An LBFGS iteration (its Python dominates the time) as a busy machine may time it: R² 0.86,
    but no time missed by more than 0.7 %, so the line predicts; with one 3 % off, it does not."""
    memory = {b: profile(b, [(FORWARD_BACKWARD, 1e3, 1e4)]) for b in (64, 128, 256)}
    flat = BatchSizeModels.fit([64, 128, 256], [13.35, 13.62, 13.75], memory, 10**12)
    assert flat.run_time.r2 < POOR_FIT_R2 and flat.run_time.max_relative_residual < 0.01
    assert flat.time_predictable and flat.predict(512).run_time_ms == pytest.approx(14.27, rel=0.01)
    assert not any("poorly" in w for w in flat.warnings())
    noisy = BatchSizeModels.fit([64, 128, 256], [13.4, 13.0, 13.8], memory, 10**12)
    assert not noisy.time_predictable and noisy.predict(512).run_time_ms is None


def test_the_document_gives_the_models_back():
    measured = [16, 32, 64]
    m = BatchSizeModels.fit(
        measured, [1.0 + 0.1 * b for b in measured], {b: profile(b, OPTIMIZER_DOMINATED) for b in measured}, 1 << 30
    )
    document = {
        **m.to_dict(),
        "samples": samples_of(measured, [1.0 + 0.1 * b for b in measured]),
        "memory_samples": [],
    }
    again = BatchSizeModels.from_dict(document, 1 << 30)
    for b in (1, 16, 100, 682, 683, 5000, 15625, 15626):
        assert again.predict(b) == m.predict(b)
    memory = document["peak_memory_bytes"]
    assert memory["phase_at_max_batch_size"] == FORWARD_BACKWARD
    assert (memory["slope"], memory["bias"]) == pytest.approx((54 * KiB, 200 * MiB))  # the deciding line


def samples_of(batch_sizes, times_ms):
    """The document's `models.samples` of these measurements (the fields the models read back)."""
    return [{"batch_size": b, "samples_per_second": b / t * 1000.0} for b, t in zip(batch_sizes, times_ms)]


# --- the boundaries, exactly (docs/analysis-document.md) --------------------------------------


def models_of(times_ms, memory_bytes_per_sample=1000, memory_bias=5000, capacity=10**9, micro_batches=1):
    """Models fitted to run times at batch sizes 8, 16 and 32 and one operation whose bytes are
    `memory_bytes_per_sample * b + memory_bias`."""
    sizes = (8, 16, 32)
    memory = {b: profile(b, [(FORWARD_BACKWARD, memory_bytes_per_sample, memory_bias)]) for b in sizes}
    return BatchSizeModels.fit(sizes, times_ms, memory, capacity, micro_batches=micro_batches)


def with_run_time(models, slope, bias):
    """`models` with a run-time line of exactly this slope and bias (a fit leaves rounding)."""
    return dataclasses.replace(models, run_time=LinearModel(slope, bias, 1.0, 0.0, 3))


def test_a_flat_run_time_predicts_no_time():
    models = with_run_time(models_of((5.0, 5.0, 5.0)), 0.0, 5.0)  # time does not grow with the batch size
    prediction = models.predict(16)
    assert (prediction.run_time_ms, prediction.samples_per_second) == (None, None)
    assert models.asymptotic_samples_per_second() is None


def test_an_asymptote_needs_fixed_costs():
    through_zero = with_run_time(models_of((0.8, 1.6, 3.2)), 0.1, 0.0)  # 0.1 ms a sample, nothing fixed
    assert through_zero.asymptotic_samples_per_second() is None
    with_fixed = with_run_time(through_zero, 0.1, 1.0)  # 0.1 ms a sample + 1 ms
    assert with_fixed.asymptotic_samples_per_second() == pytest.approx(1000 / 0.1)


def test_micro_batches_multiply_every_throughput():
    models = models_of((1.8, 2.6, 4.2), micro_batches=4)
    assert models.predict(16).samples_per_second == pytest.approx(4 * 16 / 2.6 * 1000)
    assert models.asymptotic_samples_per_second() == pytest.approx(4 * 1000 / 0.1)
    # The editor's and the service's predictions start from the document's models: k travels with them.
    written = {**models.to_dict(), "samples": [{"batch_size": b} for b in (8, 16, 32)], "memory_samples": []}
    read = BatchSizeModels.from_dict(written, 10**9)
    assert read.micro_batches == 4
    assert read.predict(16).samples_per_second == pytest.approx(4 * 16 / 2.6 * 1000)


def test_a_fixed_number_of_samples_per_step_runs_fewer_micro_batches_at_larger_batch_sizes():
    # 256 samples a step: 32 micro-batches of 8 samples, 16 of 16, 8 of 32, each micro-batch's time
    # on the line 0.1 ms × b + 1 ms. Throughput is a micro-batch's; an iteration runs 256 / b of them.
    one_micro_batch = (1.8, 2.6, 4.2)
    sizes = (8, 16, 32)
    memory = {b: profile(b, [(FORWARD_BACKWARD, 1000, 5000)]) for b in sizes}
    models = BatchSizeModels.fit(sizes, one_micro_batch, memory, 10**9, samples_per_step=256)
    for b in (16, 64, 100):
        prediction = models.predict(b)
        assert prediction.samples_per_second == pytest.approx(b / (0.1 * b + 1.0) * 1000)
        assert prediction.run_time_ms == pytest.approx(256 / b * (0.1 * b + 1.0))
        assert prediction.samples_per_second == pytest.approx(256 / prediction.run_time_ms * 1000)
    written = {**models.to_dict(), "samples": [{"batch_size": b} for b in sizes], "memory_samples": []}
    assert written["samples_per_step"] == 256
    assert BatchSizeModels.from_dict(written, 10**9).predict(64) == models.predict(64)
    assert models_of(one_micro_batch).to_dict()["samples_per_step"] is None
    # Past 256 samples a step runs less than one micro-batch: nothing is predicted, nor trusted.
    assert (models.predict(257).run_time_ms, models.predict(257).samples_per_second) == (None, None)
    assert models.trusted_range == (8, 128) and models.to_dict()["trusted_range"] == [8, 128]
    capped = BatchSizeModels.fit(sizes, one_micro_batch, memory, 10**9, samples_per_step=100)
    assert capped.trusted_range == (8, 100)
    assert (
        capped.trusted_range_end == "the samples per optimizer step, beyond which a step runs less than one micro-batch"
    )


def check(batch_size, ms, micro_batches=1):
    """A batch size timed after the models were fitted (the confirming step's), at `ms` an iteration."""
    return Sample(batch_size, TimingStats(ms, 0.0, 20, 1), profile(batch_size, OPTIMIZER_DOMINATED), micro_batches)


def test_predictions_past_the_largest_timed_follow_what_was_timed_there():
    # The line 0.01 ms × b + 1 ms through 64, 128 and 256; 1,024 then timed at 15.0 ms (the line
    # says 11.24), 128 again at 2.5 ms (below the largest timed: the line stays there).
    sizes = (64, 128, 256)
    memory = {b: profile(b, OPTIMIZER_DOMINATED) for b in sizes}
    models = with_run_time(BatchSizeModels.fit(sizes, [0.01 * b + 1.0 for b in sizes], memory, 1 << 30), 0.01, 1.0)
    checked = models.with_checks([check(128, 2.5), check(1024, 15.0)])
    assert checked.timed_past == ((1024, 15.0),)
    for b in (1, 64, 128, 256):
        assert checked.predict(b) == models.predict(b)
    # From the line's 3.56 ms at 256 to the 15.0 measured at 1,024, in a straight segment.
    assert checked.predict(512).run_time_ms == pytest.approx(3.56 + (15.0 - 3.56) * 256 / 768)
    assert checked.predict(1024).run_time_ms == pytest.approx(15.0)
    # Beyond it, the line moved up by 1,024's miss (3.76 ms): throughput still nears 1 / slope.
    assert checked.predict(4096).run_time_ms == pytest.approx(0.01 * 4096 + 1.0 + 3.76)
    assert checked.predict(512).samples_per_second == pytest.approx(512 / checked.predict(512).run_time_ms * 1000)
    # A check whose blocks spread more than a quarter of its mean corrects nothing.
    noisy = Sample(1024, TimingStats(15.0, 4.0, 20, 1), profile(1024, OPTIMIZER_DOMINATED))
    assert models.with_checks([noisy]).timed_past == ()
    assert models.with_checks([noisy]).predict(512) == models.predict(512)
    # Two checks past 256: a segment to each.
    twice = models.with_checks([check(512, 8.0), check(1024, 15.0)])
    assert twice.predict(384).run_time_ms == pytest.approx(3.56 + (8.0 - 3.56) / 2)
    assert twice.predict(768).run_time_ms == pytest.approx((8.0 + 15.0) / 2)
    # The document carries the checks: its models predict the same.
    written = {
        **checked.to_dict(),
        "samples": samples_of(sizes, [0.01 * b + 1.0 for b in sizes]),
        "checks": [check(128, 2.5).to_dict(), check(1024, 15.0).to_dict()],
        "memory_samples": [],
    }
    again = BatchSizeModels.from_dict(written, 1 << 30)
    assert again.timed_past == checked.timed_past
    for b in (200, 512, 1024, 4096):
        assert again.predict(b).run_time_ms == pytest.approx(checked.predict(b).run_time_ms, rel=1e-12)


def test_with_samples_per_step_a_check_past_the_timed_ones_counts_one_micro_batch():
    # 256 samples a step, one micro-batch on the line 0.1 ms × b + 1 ms at 8, 16 and 32; 128 timed
    # at 2 micro-batches of 15 ms each (the line says 13.8 a micro-batch).
    sizes = (8, 16, 32)
    memory = {b: profile(b, [(FORWARD_BACKWARD, 1000, 5000)]) for b in sizes}
    models = BatchSizeModels.fit(sizes, (1.8, 2.6, 4.2), memory, 10**9, samples_per_step=256)
    checked = models.with_checks([check(128, 30.0, micro_batches=2)])
    assert checked.timed_past == ((128, 15.0),)
    assert checked.predict(128).run_time_ms == pytest.approx(30.0)
    assert checked.predict(128).samples_per_second == pytest.approx(256 / 30.0 * 1000)
    assert checked.predict(64).run_time_ms == pytest.approx(4 * (4.2 + (15.0 - 4.2) * 32 / 96))


def test_the_best_batch_size_divides_the_samples_per_step():
    # 1,000 samples a step, measured at 25, 50 and 100 (0.1 ms a sample + 1 ms: throughput rises to
    # the largest batch size allowed), trusted up to 400. Memory for 300 at most (1,000 bytes a
    # sample + 5,000, 90 % of the capacity usable): at 300, `1000 // 300` micro-batches would step
    # after 900 samples; 250 takes them all. Without a fixed number of samples a step, 300.
    sizes = (25, 50, 100)
    one_micro_batch = tuple(0.1 * b + 1.0 for b in sizes)
    memory = {b: profile(b, [(FORWARD_BACKWARD, 1000, 5000)]) for b in sizes}
    capacity = math.ceil((300 * 1000 + 5000) / 0.9)
    per_step = BatchSizeModels.fit(sizes, one_micro_batch, memory, capacity, samples_per_step=1000)
    free = BatchSizeModels.fit(sizes, one_micro_batch, memory, capacity)
    assert (per_step.max_batch_size(), per_step.trusted_range) == (300, (25, 400))
    assert (per_step.best_batch_size(), free.best_batch_size()) == (250, 300)
    # Memory to spare: the trusted range's end, 400, does not divide 1,000 either.
    roomy = BatchSizeModels.fit(sizes, one_micro_batch, memory, 10**9, samples_per_step=1000)
    assert roomy.best_batch_size() == 250


def test_a_peak_of_exactly_the_usable_memory_fits():
    # As a document writes the models (a fit leaves rounding; these lines are exact).
    line = {"slope": 1000.0, "bias": 5000.0, "r2": 1.0, "max_relative_residual": 0.0, "points": 3}
    written = {
        "samples": [{"batch_size": b} for b in (8, 16, 32)],
        "memory_samples": [],
        "run_time_ms": {**line, "slope": 0.1, "bias": 1.0},
        "peak_memory_bytes": {**line, "fitted": "per_phase", "phases": [{"name": FORWARD_BACKWARD, **line}]},
        "memory_headroom_fraction": 0.1,
    }
    models = BatchSizeModels.from_dict(written, 100_000)  # usable: 90,000 bytes
    assert models.usable_memory_bytes == 90_000
    assert models.predict(85).peak_memory_bytes == 90_000.0  # 1000 · 85 + 5000
    assert models.predict(85).fits and not models.predict(86).fits
    assert models.max_batch_size() == 85


def test_a_largest_fit_at_the_end_of_the_trusted_range_is_no_extrapolation():
    # usable memory: 0.9 · capacity; 1000 b + 5000 reaches it at b = 128, 4 × the largest measured (32).
    at_the_end = models_of((1.8, 2.6, 4.2), capacity=int((1000 * 128 + 5000) / 0.9) + 1)
    assert at_the_end.max_batch_size() == 128
    assert not at_the_end.max_batch_size_extrapolated()
    beyond = models_of((1.8, 2.6, 4.2), capacity=int((1000 * 129 + 5000) / 0.9) + 1)
    assert beyond.max_batch_size() == 129
    assert beyond.max_batch_size_extrapolated()


def test_a_document_gives_back_the_very_models_it_was_written_from():
    # Timed at 16-64 with some noise; memory also probed at 128 and 256; a headroom of its own.
    timed, probed = [16, 32, 64], [128, 256]
    memory = {b: profile(b, OPTIMIZER_DOMINATED) for b in timed + probed}
    fitted = BatchSizeModels.fit(timed, [2.7, 4.1, 7.4], memory, 1 << 30)
    models = dataclasses.replace(fitted, headroom_fraction=0.25)
    written = {
        **models.to_dict(),
        "samples": samples_of(timed, [2.7, 4.1, 7.4]),
        "memory_samples": [{"batch_size": b} for b in probed],
    }
    again = BatchSizeModels.from_dict(written, 1 << 30)
    assert again == models
    assert again.memory_batch_sizes == (16, 32, 64, 128, 256) and again.measured_batch_sizes == (16, 32, 64)


def test_two_timed_batch_sizes_say_the_fit_cannot_be_checked_and_survive_the_document():
    memory = {b: profile(b, OPTIMIZER_DOMINATED) for b in (16, 32)}
    models = BatchSizeModels.fit([16, 32], [2.6, 4.2], memory, 1 << 30)
    assert models.run_time.r2 is None
    written = {**models.to_dict(), "samples": samples_of((16, 32), (2.6, 4.2)), "memory_samples": []}
    again = BatchSizeModels.from_dict(written, 1 << 30)
    assert again == models
    assert again.warnings()[0] == (
        "The run-time model rests on 2 batch sizes only, so its fit cannot be checked: treat predicted times as "
        "rough, or lower the batch size (--batch-size) so that three batch sizes can be measured."
    )


def test_a_run_time_that_does_not_grow_at_all_is_warned_about():
    flat = with_run_time(models_of((5.0, 5.0, 5.0)), 0.0, 5.0)
    assert flat.warnings()[0] == (
        "Iteration time did not grow with the batch size over the measured range, so no time or throughput is "
        "predicted at other batch sizes: re-run on a quiet machine, or profile a larger batch size (--batch-size) "
        "if the model is too small to keep the device busy."
    )
    growing = with_run_time(flat, 1e-9, 5.0).warnings()
    assert not any("did not grow" in warning for warning in growing)  # growing at all: no such warning


@pytest.mark.parametrize(
    ("batch_size", "measured", "largest", "ladder"),
    [
        # powers of two from the smallest measured up to 16 × the user's (512 included)
        (32, [8, 16, 32], None, [8, 16, 32, 64, 128, 256, 512]),
        # ... but not above the largest that fits, which is shown
        (32, [8, 16, 32], 100, [8, 16, 32, 64, 100]),
        # measured ones are shown even above it, and in-between ones are kept
        (32, [8, 48, 200], 100, [8, 16, 32, 48, 64, 100, 200]),
        # so is the user's own
        (256, [64, 128], 100, [64, 100, 128, 256]),
        # nothing below the smallest measured
        (4, [3, 5], None, [3, 4, 5, 8, 16, 32, 64]),
        # 16 × 31 = 496: 512 is beyond it, with or without a largest that fits above it
        (31, [8, 16, 31], None, [8, 16, 31, 32, 64, 128, 256]),
        (31, [8, 16, 31], 1000, [8, 16, 31, 32, 64, 128, 256, 1000]),
    ],
)
def test_the_prediction_ladder(batch_size, measured, largest, ladder):
    assert prediction_ladder(batch_size, measured, largest) == ladder


# --- what the models recommend, and the warnings, at their edges ----------------------------

RISING = (1.8, 2.6, 4.2)  # 0.1 ms a sample + 1 ms at 8, 16, 32


# Time growing faster than the batch size: 0.3, 1.1 and 2.7 ms at 8, 16 and 32 (0.1 ms a sample
# − 0.5 ms): 26,667, 14,545 and 11,852 samples/s.
FALLING_TIMES = (0.3, 1.1, 2.7)


def test_a_negative_intercept_recommends_the_fastest_measured_or_what_fits_below_it():
    assert models_of(FALLING_TIMES).best_batch_size() == 8
    tight = models_of(FALLING_TIMES, capacity=int((1000 * 5 + 5000) / 0.9) + 1)  # 5 samples fit
    assert (tight.max_batch_size(), tight.best_batch_size()) == (5, 5)
    unbounded = models_of(FALLING_TIMES, memory_bytes_per_sample=0)  # memory does not grow
    assert (unbounded.max_batch_size(), unbounded.best_batch_size()) == (None, 8)
    fits_16 = models_of(FALLING_TIMES, capacity=int((1000 * 20 + 5000) / 0.9) + 1)  # 20 samples fit
    assert (fits_16.max_batch_size(), fits_16.best_batch_size()) == (20, 8)


def test_a_negative_intercept_recommends_what_was_measured_fastest_not_the_smallest():
    # A CLIP loss's times at 256, 512 and 1,024: the line falls (−2.8 ms), but 512 measured 2 %
    # faster than 256; recommending 256 read "use 256 for 23,357 samples/s, 2% slower than yours".
    sizes, times = (256, 512, 1024), (10.96, 21.49, 48.97)
    memory = {b: profile(b, [(FORWARD_BACKWARD, 1000, 5000)]) for b in sizes}
    models = BatchSizeModels.fit(sizes, times, memory, 10**12)
    assert models.run_time.bias < 0
    assert models.best_batch_size() == 512
    again = BatchSizeModels.from_dict(
        models.to_dict() | {"samples": samples_of(sizes, times), "memory_samples": []}, 10**12
    )
    assert again.best_batch_size() == 512


def test_fixed_costs_recommend_the_end_of_the_trusted_range_or_what_fits_below_it():
    assert models_of(RISING).best_batch_size() == 128  # 4 × the largest measured
    assert with_run_time(models_of(RISING), 0.1, 0.0).best_batch_size() == 128  # no fixed cost: flat
    tight = models_of(RISING, capacity=int((1000 * 100 + 5000) / 0.9) + 1)  # 100 samples fit
    assert (tight.max_batch_size(), tight.best_batch_size()) == (100, 100)


def test_the_knee_is_never_below_one_sample():
    assert with_run_time(models_of(RISING), 1.0, 0.01).throughput_knee_batch_size() == 1


def test_a_time_of_zero_is_not_predicted_but_any_time_above_it_is():
    models = with_run_time(models_of(RISING), 0.5, -8.0)  # 0 ms at 16 samples, 1 ms at 18
    assert models.predict(16).run_time_ms is None and models.predict(16).samples_per_second is None
    assert models.predict(18).run_time_ms == 1.0


NOT_GROWING = (
    "Iteration time did not grow with the batch size over the measured range, so no time or throughput is "
    "predicted at other batch sizes: re-run on a quiet machine, or profile a larger batch size (--batch-size) if "
    "the model is too small to keep the device busy."
)
POOR_FIT = (
    "The run-time model fits the measurements poorly (R² = 0.70; it misses one by 5%), even after timing them "
    "again: no time or throughput is predicted at other batch sizes. Re-run on a quiet machine."
)
FALLING = (
    "Iteration time grows faster than the batch size over the measured range (the run-time line has a negative "
    "intercept), so throughput is predicted to fall at larger batch sizes: prefer the fastest measured batch "
    "size, and re-run on a quiet machine to confirm it."
)
EXTRAPOLATED = (
    "The largest batch size predicted to fit (129) is 4× the largest measured (32): an extrapolation far beyond "
    "the measurements, where the allocator, caches and the machine can bend the lines; plan with a capacity "
    "(--memory-capacity) to get an answer nearer to them."
)
CURVED = (
    "The run-time line misses one of the measured batch sizes' times by 12%: iteration time does not grow in a "
    "straight line with the batch size here (or the machine's speed changed while they were timed), so predicted "
    "times can be off by as much between the measured batch sizes and by more beyond them."
)
CURVED_MEMORY = (
    "The peak-memory model misses one of the measured batch sizes' peaks by 12%: memory does not grow in a "
    "straight line with the batch size here (allocations that depend on it, or memory kept from earlier "
    "iterations), so predicted peaks, and the largest batch size that fits, can be off by as much or more."
)
FITS_AT_128 = int((1000 * 128 + 5000) / 0.9) + 1  # the largest that fits: 4 × the largest measured
FITS_AT_129 = int((1000 * 129 + 5000) / 0.9) + 1  # just beyond


def with_line(slope, bias, r2, capacity=FITS_AT_128, residual=0.0, memory_residual=0.0):
    line = LinearModel(slope, bias, r2, residual, 3)
    fitted = models_of(RISING, capacity=capacity)
    memory = dataclasses.replace(fitted.peak_memory, max_relative_residual=memory_residual)
    return dataclasses.replace(fitted, run_time=line, peak_memory=memory)


@pytest.mark.parametrize(
    ("models", "warnings"),
    [
        (with_line(0.1, 1.0, 1.0), []),
        (with_line(0.0, 5.0, 1.0), [NOT_GROWING]),
        (with_line(0.1, 1.0, 0.7, residual=0.05), [POOR_FIT]),
        (with_line(0.1, 1.0, 0.95, residual=0.05), []),  # at the threshold the fit is good enough
        (with_line(0.1, 1.0, 0.7, residual=0.01), []),  # a low R², but every time within 1 %
        (with_line(0.1, -0.5, 1.0), [FALLING]),
        (with_line(0.1, 0.0, 1.0), []),  # through zero: throughput flat, not falling
        (with_line(0.1, 1.0, 1.0, capacity=FITS_AT_129), [EXTRAPOLATED]),
        (with_line(0.1, 1.0, 0.99, residual=0.10), []),  # at the threshold: straight enough
        (with_line(0.1, 1.0, 0.99, residual=0.12), [CURVED]),
        (with_line(0.1, -0.5, 0.99, residual=0.12), [FALLING, CURVED]),
        (with_line(0.1, 1.0, 0.7, residual=0.3), [POOR_FIT.replace("5%", "30%")]),  # no time: nothing to be off
        (with_line(0.1, 1.0, 1.0, memory_residual=0.10), []),  # at the threshold: straight enough
        (with_line(0.1, 1.0, 1.0, memory_residual=0.12), [CURVED_MEMORY]),
    ],
    ids=[
        "none",
        "not growing",
        "poor fit",
        "fit at threshold",
        "close to every time",
        "falling",
        "through zero",
        "extrapolated",
        "straight enough",
        "curved",
        "curved and falling",
        "curved and poor",
        "memory straight enough",
        "memory curved",
    ],
)
def test_each_warning_at_its_edge(models, warnings):
    assert models.warnings() == warnings


def test_a_time_that_grows_faster_than_the_batch_size_is_said_to_be_off_the_line():
    """The bench's heavy model as one analysis measured it, and 48 samples timed beside it: a line
    with R² 0.99 that misses batch size 8 by 15 % and predicts 48 samples 14 % short."""
    memory = {b: profile(b, [(FORWARD_BACKWARD, 1e3, 1e4)]) for b in (8, 16, 32)}
    heavy = BatchSizeModels.fit([8, 16, 32], [418.9, 746.9, 1830.6], memory, 10**12)
    assert heavy.run_time.r2 > POOR_FIT_R2
    assert heavy.run_time.max_relative_residual == pytest.approx(0.146, abs=0.001)
    assert any("misses one of the measured batch sizes' times by 15%" in w for w in heavy.warnings())
    assert heavy.predict(48).run_time_ms == pytest.approx(3204.5 * 0.86, rel=0.01)
    straight = BatchSizeModels.fit([8, 16, 32], [410.0, 810.0, 1610.0], memory, 10**12)
    assert not any("misses" in w for w in straight.warnings())


def test_peaks_off_the_memory_models_lines_are_said_to_be():
    """Peaks that grew by 14 MiB between the user's batch size and the probes (a leak kept 20 MiB
    by the time the probes ran): one line per operation cannot pass through them."""
    times = [1.0, 2.0, 4.0]
    leaked = {b: profile(b, [(FORWARD_BACKWARD, 6e3, 1.5e6 if b == 64 else 15.6e6)], start=0) for b in (32, 64, 128)}
    curved = BatchSizeModels.fit([32, 64, 128], times, leaked, 10**12)
    assert curved.peak_memory.max_relative_residual > 1.0
    assert any("misses one of the measured batch sizes' peaks by" in w for w in curved.warnings())
    straight = {b: profile(b, [(FORWARD_BACKWARD, 6e3, 1.5e6)]) for b in (32, 64, 128)}
    assert not any("peaks by" in w for w in BatchSizeModels.fit([32, 64, 128], times, straight, 10**12).warnings())


def test_memory_that_nothing_bounds_is_described_by_the_line_at_the_largest_measured():
    flat = [(FORWARD_BACKWARD, 0, 5 * MiB), (OPTIMIZER, 0, 7 * MiB)]  # neither grows with the batch size
    models = BatchSizeModels.fit([8, 16, 32], RISING, {b: profile(b, flat) for b in (8, 16, 32)}, 1 << 30)
    assert models.max_batch_size() is None
    memory = models.to_dict()["peak_memory_bytes"]
    assert (memory["slope"], memory["bias"]) == pytest.approx((0, 7 * MiB))


# --- memory that grows with the batch size squared ---------------------------------------------


def quadratic_profile(batch_size, operations):
    """A profile whose operations hold `quadratic * b² + slope * b + bias` bytes each;
    `operations` is [(phase, quadratic, slope, bias), ...] in order."""
    return profile(batch_size, [(phase, q * batch_size + s, b) for phase, q, s, b in operations])


# A contrastive loss, in miniature: Adam's step holds 17 MiB and 5 KiB a sample; the forward and
# backward pass 17 KiB a sample and, while the batch × batch logits are alive, 20 B × b².
CONTRASTIVE = [
    (FORWARD_BACKWARD, 0, 17 * KiB, 10 * MiB),
    (FORWARD_BACKWARD, 20, 17 * KiB, 10 * MiB),
    (FORWARD_BACKWARD, 12, 17 * KiB, 10 * MiB),
    (OPTIMIZER, 0, 5 * KiB, 17 * MiB),
]


def test_a_fourth_batch_size_lets_memory_grow_with_the_batch_size_squared():
    measured = [256, 512, 1024, 4096]
    model = fit_peak_memory(measured, [quadratic_profile(b, CONTRASTIVE) for b in measured])
    assert model.quadratic and model.max_relative_residual == pytest.approx(0, abs=1e-9)
    assert [curve.name for curve in model.phases] == [OPTIMIZER, FORWARD_BACKWARD]
    steepest = model.phases[-1]
    assert (steepest.quadratic, steepest.slope, steepest.bias) == pytest.approx((20, 17 * KiB, 10 * MiB))
    for b in (1, 300, 20_000, 10**6):  # far beyond the measurements, as the bytes would be
        assert model(b) == pytest.approx(quadratic_profile(b, CONTRASTIVE).peak_bytes, rel=1e-9)
    usable = 20 << 30
    largest = model.largest_within(usable)
    assert model(largest) <= usable < model(largest + 1)
    # The lines through the same operations: the largest that fits many times too large.
    lines = fit_peak_memory(measured[:3], [quadratic_profile(b, CONTRASTIVE) for b in measured[:3]])
    assert not lines.quadratic and lines.max_relative_residual > 0.05
    assert lines.largest_within(usable) > 5 * largest


def test_three_batch_sizes_never_give_a_quadratic_that_nothing_checks():
    measured = [256, 512, 1024]
    model = fit_peak_memory(measured, [quadratic_profile(b, CONTRASTIVE) for b in measured])
    assert not model.quadratic
    # It is kept aside, unchecked: it rises above the lines where they put the limit.
    steepest = max(model.unchecked, key=lambda curve: curve.quadratic)
    assert (steepest.quadratic, steepest.slope, steepest.bias) == pytest.approx((20, 17 * KiB, 10 * MiB))
    limit = model.largest_within(20 << 30)
    assert model.may_rise_above(limit, 0.01)


def test_a_large_baseline_hides_no_curve_and_makes_none():
    # 2 GiB alive before the iteration (weights, or another program's tensors in the process):
    # the logits' curve is 0.2 % of the peak at 128 samples, and still found; lines stay lines.
    baseline = [(FORWARD_BACKWARD, 0, 0, 2 << 30)]
    shifted = [(phase, q, s, b + (2 << 30)) for phase, q, s, b in CONTRASTIVE]
    measured = [32, 64, 128]
    three = fit_peak_memory(measured, [quadratic_profile(b, baseline + shifted) for b in measured])
    assert three.unchecked and three.max_relative_residual < 0.01
    four = fit_peak_memory([*measured, 512], [quadratic_profile(b, baseline + shifted) for b in [*measured, 512]])
    assert four.quadratic and not four.unchecked
    lines = [(FORWARD_BACKWARD, 0, 17 * KiB, 2 << 30), (OPTIMIZER, 0, 5 * KiB, 3 << 30)]
    affine = fit_peak_memory(measured, [quadratic_profile(b, lines) for b in measured])
    assert not affine.unchecked and not affine.quadratic


def test_bytes_a_few_off_a_line_are_no_curve():
    # 60 B a sample, 8 bytes more at 6 samples (a shape with an integer division): off the line by
    # more than 1 % of the 240 bytes it grows, but by less than the allocator's rounding.
    measured = [2, 4, 6]
    profiles = [profile(b, [(FORWARD_BACKWARD, 60, 2852 + (8 if b == 6 else 0))]) for b in measured]
    model = fit_peak_memory(measured, profiles)
    assert not model.unchecked and not model.quadratic


def test_bytes_that_no_quadratic_follows_stay_on_a_line():
    # Memory allocated in steps (a workspace chosen per shape): no quadratic reproduces it.
    measured = [16, 32, 64, 128]
    steps = {16: 1 * MiB, 32: 1 * MiB, 64: 8 * MiB, 128: 8 * MiB}
    profiles = [profile(b, [(FORWARD_BACKWARD, 1 * KiB, steps[b])]) for b in measured]
    model = fit_peak_memory(measured, profiles)
    assert not model.quadratic and model.max_relative_residual > 0.10


# Measured on an NVIDIA H200 (torch 2.11, bench/gpu_check.sh): (batch size, bytes alive when the
# iteration starts, the allocator's peak during one operation, the bytes allocated right after it).
# The CNN example's convolution backward with cuDNN: a line after the operation, while cuDNN chose
# an algorithm with a 58 MiB workspace at 256 samples.
CUDNN_WORKSPACE_STEP = [
    (16, 68775936, 74654208, 73474560),
    (32, 68972544, 80486912, 78389760),
    (64, 69365760, 92414464, 88220160),
    (256, 71726592, 209070080, 148252672),
]
# The same example without cuDNN, an operation whose tensors are a line in the batch size but for
# the caching allocator's unsplit blocks: 0.9 MiB more at 96 samples.
UNSPLIT_BLOCKS = [
    (16, 75167744, 76214784, 76214784),
    (24, 75266048, 76837376, 76837376),
    (32, 75364352, 77459968, 77459968),
    (96, 76151296, 83358720, 83358720),
]


def cuda_profiles(measured, slack=CUDA_COUNT_SLACK_BYTES, held=True):
    return [
        MemoryProfile(
            start, (peak,), ("convolution_backward.default",), ((0, FORWARD_BACKWARD),),
            operation_held_bytes=(after if held else peak,), count_slack_bytes=slack,
        )
        for _, start, peak, after in measured
    ]  # fmt: skip


def test_a_kernels_scratch_space_that_grows_in_a_step_is_no_quadratic():
    sizes = [b for b, *_ in CUDNN_WORKSPACE_STEP]
    model = fit_peak_memory(sizes, cuda_profiles(CUDNN_WORKSPACE_STEP))
    assert not model.quadratic and not model.unchecked
    # The line misses the step (the document's max_relative_residual says by how much) rather
    # than bending through it, and nothing calls it a batch × batch tensor.
    assert model.max_relative_residual > 0.05
    models = BatchSizeModels.fit(sizes[:3], RISING, dict(zip(sizes, cuda_profiles(CUDNN_WORKSPACE_STEP))), 100 << 30)
    assert not any("square of the batch size" in note for note in models.warnings())
    assert not models.predict(2 * sizes[2]).extrapolated  # beyond the largest timed (64), as for lines
    # The same bytes held as tensors after the operation would be a curve.
    assert fit_peak_memory(sizes, cuda_profiles(CUDNN_WORKSPACE_STEP, held=False)).quadratic


def test_the_caching_allocators_unsplit_blocks_make_no_curve():
    sizes = [b for b, *_ in UNSPLIT_BLOCKS]
    model = fit_peak_memory(sizes, cuda_profiles(UNSPLIT_BLOCKS))
    assert not model.quadratic and not model.unchecked
    assert fit_peak_memory(sizes[:3], cuda_profiles(UNSPLIT_BLOCKS[:3])).unchecked == ()
    # Counted exactly (the CPU's counter), 0.9 MiB off the line would be a curve.
    assert fit_peak_memory(sizes, cuda_profiles(UNSPLIT_BLOCKS, slack=0)).quadratic


def test_a_quadratic_that_a_line_overtakes_for_a_while_holds_twice():
    # b² / 100 + 1000 against 6 b + 200: the line is higher between 200 and 400 samples (the
    # difference is (b − 200)(b − 400) / 100); on the ties the quadratic, the steeper, holds.
    curves = (
        PhaseCurve(FORWARD_BACKWARD, 0.0, 1000.0, None, 0.01),
        PhaseCurve(OPTIMIZER, 6.0, 200.0, None),
    )
    model = PeakMemoryModel(curves, PER_OPERATION, 4, 0.0)
    assert model.segments() == [(1, 200, curves[0]), (201, 399, curves[1]), (400, None, curves[0])]
    assert model.segments(300) == [(1, 200, curves[0]), (201, None, curves[1])]
    for b in range(1, 1000):
        holder = next(c for first, last, c in model.segments() if first <= b and (last is None or b <= last))
        assert model.phase_at(b) is holder, b


def test_the_envelope_keeps_only_the_curves_that_hold_somewhere():
    measured = [8, 16, 32, 64]
    below = (FORWARD_BACKWARD, 10, 100, 0)  # under the next one at every batch size
    above = (FORWARD_BACKWARD, 10, 200, 0)
    flat = (OPTIMIZER, 0, 0, 100 * KiB)
    model = fit_peak_memory(measured, [quadratic_profile(b, [below, above, flat]) for b in measured])
    assert [(curve.name, curve.quadratic) for curve in model.phases] == [
        (OPTIMIZER, 0.0),
        (FORWARD_BACKWARD, pytest.approx(10)),
    ]


def test_a_quadratic_survives_the_document_and_decides_what_fits():
    measured = [256, 512, 1024, 4096]
    memory = {b: quadratic_profile(b, CONTRASTIVE) for b in measured}
    times = [11.0, 21.5, 49.0]
    models = BatchSizeModels.fit(measured[:3], times, memory, 1 << 30)
    written = models.to_dict()
    assert written["peak_memory_bytes"]["quadratic"] == pytest.approx(20)
    assert written["trusted_range"] == [256, 1024]  # time: no further than what was timed
    assert models.predict(1025).extrapolated and not models.predict(1024).extrapolated
    document = {**written, "samples": samples_of(measured[:3], times), "memory_samples": [{"batch_size": 4096}]}
    again = BatchSizeModels.from_dict(document, 1 << 30)
    assert again == models
    assert any("× batch size²" in note and "(1,024)" in note for note in models.warnings())
