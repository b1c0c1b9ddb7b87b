"""The count of optimizer steps per call decides whether the iteration's calls differ: fixed counts
here (tests/test_training_loops.py drives real loops through an analysis)."""

from __future__ import annotations

from skyline_engine.measure.steps_per_call import StepsPerCall


def counted(**calls_by_steps: int) -> StepsPerCall:
    pattern = StepsPerCall()
    for steps, calls in calls_by_steps.items():
        for _ in range(calls):
            pattern.add(int(steps.lstrip("s")))
    return pattern


def test_calls_that_all_step_alike_do_not_differ():
    assert counted(s1=500).warning() is None
    assert counted(s2=40).warning() is None


def test_a_step_skipped_once_in_hundreds_of_calls_is_left_unsaid():
    # A GradScaler skipping a step when its scale overflows.
    assert counted(s1=999, s0=1).warning() is None


def test_a_critic_stepped_every_call_and_a_generator_every_fifth_differ():
    warning = counted(s1=400, s2=100).warning()
    assert warning is not None
    assert (
        "of 500 calls measured, 400 made one optimizer step and 100 made 2 optimizer steps (one call in 5)" in warning
    )


def test_calls_that_differ_half_and_half_name_no_period():
    warning = counted(s0=10, s1=10).warning()
    assert (
        warning is not None
        and "of 20 calls measured, 10 stepped no optimizer and 10 made one optimizer step." in warning
    )
