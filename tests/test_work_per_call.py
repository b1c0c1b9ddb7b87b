"""The optimizer steps and the passes through the model of each call decide whether the
iteration's calls differ, and how many calls make one cycle: fixed counts here
(tests/test_training_loops.py drives real loops through an analysis)."""

from __future__ import annotations

from skyline_engine.measure.work_per_call import MAX_CYCLE, CallWork, WorkPerCall


def calls(*steps: int, times: int = 1) -> WorkPerCall:
    """Calls that made `steps` optimizer steps, in this order, `times` over, each running the model once."""
    return calls_doing(*(CallWork(count, 1) for count in steps), times=times)


def calls_doing(*work: CallWork, times: int = 1) -> WorkPerCall:
    """Calls number 1, 2, ... that did `work`, in this order, `times` over."""
    pattern = WorkPerCall()
    for call, each in enumerate([*work] * times, start=1):
        pattern.add(each, call)
    return pattern


def test_calls_that_all_step_alike_do_not_differ():
    for pattern in (calls(1, times=500), calls(2, times=40)):
        assert not pattern.varies() and pattern.cycle() == 1 and pattern.warning() is None


def test_a_step_skipped_once_in_hundreds_of_calls_is_left_unsaid():
    # A GradScaler skipping a step when its scale overflows.
    assert calls(*[1] * 500, 0, *[1] * 499).warning() is None


def test_a_critic_stepped_every_call_and_a_generator_every_fifth_make_a_cycle_of_five():
    pattern = calls(1, 1, 1, 1, 2, times=100)
    assert pattern.cycle() == 5
    warning = pattern.warning(recorded_calls=5)
    assert warning is not None
    assert "of 500 calls measured, 400 made one optimizer step and 100 made 2 optimizer steps (one call in 5)" in (
        warning
    )
    assert "Skyline measured it in whole cycles of 5 calls: the per-line breakdown averages one cycle" in warning
    # Where the breakdown recorded something else than the cycle, it says what that can miss.
    assert "which may lack the rarer work" in (pattern.warning(recorded_calls=3) or "")


def test_calls_that_alternate_make_a_cycle_of_two_and_name_no_period():
    pattern = calls(0, 1, times=10)
    assert pattern.cycle() == 2
    warning = pattern.warning()
    assert warning is not None and "of 20 calls measured, 10 stepped no optimizer and 10 made one optimizer step." in (
        warning
    )


def test_a_cycle_seen_fewer_than_three_times_is_not_yet_known():
    assert calls(1, 1, 1, 1, 2, 1).cycle() is None
    assert calls(1, 1, 1, 1, 2, 1, 1, 1, 1, 2).cycle() is None
    assert calls(1, 1, 1, 1, 2, times=3).cycle() == 5


def test_a_scaler_skipping_a_step_or_two_soon_after_its_first_is_left_unsaid():
    # On a busy machine 30 calls were measured, one of them a skipped step: no pattern, no warning,
    # and once enough calls are seen, no cycle to look for.
    skips = calls(*[1] * 10, 0, *[1] * 15, 0, *[1] * 4)
    assert not skips.varies() and skips.warning() is None and skips.cycle() is None
    settled = calls(*[1] * 10, 0, *[1] * 15, 0, *[1] * 44)
    assert settled.cycle() == 1 and settled.warning() is None


def test_a_cycle_ends_with_the_call_that_steps_differently():
    assert calls(1, 1, 1, 1, 2, times=3).last_cycle_end() == 15
    assert calls(1, 1, 1, 1, 2, 1, times=3).last_cycle_end() == 17
    assert WorkPerCall().last_cycle_end() is None


def test_steps_at_irregular_calls_or_cycles_too_long_to_record_make_no_cycle():
    irregular = calls(0, 0, 1, 0, 0, 0, 1, 0, 1, times=6)
    assert irregular.varies() and irregular.cycle() == 1
    long = calls(*[0] * MAX_CYCLE, 1, times=8)
    assert long.varies() and long.cycle() == 1
    assert "which may lack the rarer work" in (long.warning(recorded_calls=3) or "")


def test_an_evaluation_every_tenth_call_makes_a_cycle_of_ten_told_by_the_passes_through_the_model():
    train, evaluate = CallWork(1, 1), CallWork(1, 2)
    pattern = calls_doing(*[train] * 9, evaluate, times=30)
    assert pattern.cycle() == 10 and pattern.last_cycle_end() == 300
    warning = pattern.warning(recorded_calls=10)
    assert warning is not None
    # The steps do not tell these calls apart, so the warning does not count them.
    assert "of 300 calls measured, 270 ran the model once and 30 ran the model twice (one call in 10)." in warning
    assert "optimizer" not in warning and "run what runs the model on some calls only" in warning


def test_calls_that_differ_in_both_steps_and_passes_name_both():
    pattern = calls_doing(CallWork(0, 1), CallWork(1, 3), times=20)
    warning = pattern.warning(recorded_calls=2)
    assert warning is not None
    assert (
        "20 ran the model once and stepped no optimizer, and 20 ran the model 3 times and made one optimizer step"
        in warning
    )
    assert "make one call one whole cycle" in warning


def test_rare_irregular_work_says_what_the_time_and_the_breakdown_hold():
    # An evaluation every 50th call: a cycle too long to record whole, so the warning says what
    # the estimate (the mean over the calls timed) and the recorded calls hold.
    pattern = calls_doing(*[CallWork(1, 1)] * 49, CallWork(1, 2), times=4)
    assert pattern.varies() and pattern.cycle() == 1
    warning = pattern.warning(recorded_calls=3) or ""
    assert "the rarer work as often as it came" in warning and "may lack the rarer work" in warning


def test_a_cycle_is_found_by_call_numbers_with_other_batch_sizes_calls_between():
    # Interleaved timing: blocks of this batch size's calls, other batch sizes' blocks between.
    pattern = WorkPerCall()
    for call in [*range(1, 11), *range(18, 28), *range(41, 51)]:
        pattern.add(CallWork(2 if call % 5 == 0 else 1, 1), call)
    assert pattern.cycle() == 5 and pattern.last_cycle_end() == 50


def test_rare_work_at_distances_of_four_and_six_is_no_cycle_of_two():
    pattern = calls(*[1, 1, 1, 2, 1, 1, 1, 1, 1, 2], times=8)
    assert pattern.varies() and pattern.cycle() == 1
