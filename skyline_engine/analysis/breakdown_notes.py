"""What the user should know about how a breakdown was obtained: said of the breakdown as the
document holds it, fitted to the document's iteration (analysis/document.py), so that a warning's
figures are the document's own."""

from __future__ import annotations

from skyline_engine.attribute.breakdown import EAGER_REPLAY, Breakdown

# Below this, the recorded operations ran notably slower than the measured iteration.
NOTABLE_SCALING = 0.8

# Below this share of the iteration on user lines, the breakdown says where the rest may be.
LOW_ATTRIBUTION = 0.5


def breakdown_notes(breakdown: Breakdown) -> list[str]:
    """What the user should know about how the breakdown was obtained."""
    notes = []
    scale = breakdown.attribution.scaled_by
    if breakdown.attribution.mode == EAGER_REPLAY:
        took = f"took {1 / scale:.1f}× as long as" if scale < 1 else "took no longer than"
        notes.append(
            "The model is compiled (torch.compile): its per-line times and peak memory come from an eager run "
            "of the same iteration, as the compiler's fused kernels belong to no line; that run's operations "
            f"{took} the compiled iteration, whose time is the one measured. Compare lines by their shares."
        )
    elif scale < NOTABLE_SCALING:
        # On a quiet machine too (the default example, 1.1 to 1.4 times in fresh processes): between
        # operations the recorder's own work lets OpenMP's threads stop spinning (measure/openmp.py
        # shortens their spin) and the caches cool, and the next operation pays to wake them.
        notes.append(
            f"Operations ran {1 / scale - 1:.0%} slower while recorded than in the measured iteration: "
            "between them the recorder's own work lets the CPU's threads idle and its caches cool, which "
            "weighs most on short operations (a busy machine adds more). The per-line times were scaled "
            "down to the measured iteration: compare lines by their shares; a larger batch size "
            "(--batch-size) makes operations longer and the difference smaller."
        )
    share = breakdown.attribution.user_lines_fraction
    if share is not None and share < LOW_ATTRIBUTION:
        # Not the user's own Python alone: LBFGS's line search and history, its own Python between
        # tiny operations, was 76 % of a small model's iteration, told to move data preparation.
        notes.append(
            f"Only {share:.0%} of the iteration's time is in operations attributed to your lines; the "
            "rest (untracked) is Python work between operations (your code's, or an optimizer's own: "
            "LBFGS's line search, a loop over many parameters), or work on other threads, which the "
            "breakdown does not see: move data preparation into the input provider (it is not timed), "
            "give the optimizer foreach=True where it takes it, or use a larger batch size "
            "(--batch-size) to spread that work over more samples."
        )
    return notes
