"""The count of optimizer steps per call decides whether the iteration's calls differ, and how
many calls make one cycle: fixed counts here (tests/test_training_loops.py drives real loops
through an analysis)."""

from __future__ import annotations

from skyline_engine.measure.steps_per_call import MAX_CYCLE, StepsPerCall


def calls(*steps: int, times: int = 1) -> StepsPerCall:
    """Calls that made `steps` optimizer steps, in this order, `times` over."""
    pattern = StepsPerCall()
    for _ in range(times):
        for count in steps:
            pattern.add(count)
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
    assert "which may lack a step" in (pattern.warning(recorded_calls=3) or "")


def test_calls_that_alternate_make_a_cycle_of_two_and_name_no_period():
    pattern = calls(0, 1, times=10)
    assert pattern.cycle() == 2
    warning = pattern.warning()
    assert warning is not None and "of 20 calls measured, 10 stepped no optimizer and 10 made one optimizer step." in (
        warning
    )


def test_a_cycle_seen_once_is_not_yet_known():
    assert calls(1, 1, 1, 1, 2, 1).cycle() is None
    assert calls(1, 1, 1, 1, 2, 1, 1, 1, 1, 2).cycle() == 5


def test_a_cycle_ends_with_the_call_that_steps_differently():
    assert calls(1, 1, 1, 1, 2, times=3).ends_a_cycle()
    assert not calls(1, 1, 1, 1, 2, 1, times=3).ends_a_cycle()
    assert not StepsPerCall().ends_a_cycle()


def test_steps_at_irregular_calls_or_cycles_too_long_to_record_make_no_cycle():
    irregular = calls(0, 0, 1, 0, 0, 0, 1, 0, 1, times=6)
    assert irregular.varies() and irregular.cycle() == 1
    long = calls(*[0] * MAX_CYCLE, 1, times=8)
    assert long.varies() and long.cycle() == 1
    assert "which may lack a step" in (long.warning(recorded_calls=3) or "")
