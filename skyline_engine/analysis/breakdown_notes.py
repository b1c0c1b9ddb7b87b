"""What the user should know about how a breakdown was obtained: said of the breakdown as the
document holds it, fitted to the document's iteration (analysis/assembly.py), so that a warning's
figures are the document's own."""

from __future__ import annotations

from skyline_engine.attribute.breakdown import EAGER_REPLAY, Breakdown
from skyline_engine.attribute.kernels import THREAD_CPU

# Below this, the recorded operations ran notably slower than the measured iteration; above
# NOTABLE_WAIT, the measured iteration notably slower than they and the Python between them.
NOTABLE_SCALING = 0.8
NOTABLE_WAIT = 1.25

# Below this share of the iteration on user lines, the breakdown says where the rest may be.
LOW_ATTRIBUTION = 0.5
# From this share of the untracked time inside optimizer steps on, the note says it is theirs.
MOSTLY = 0.5


def breakdown_notes(breakdown: Breakdown, on_gpu: bool = False, script: bool = False) -> list[str]:
    """What the user should know about how the breakdown was obtained (`on_gpu`: timed by CUDA
    events, where operations slow down while recorded for another reason; `script`: a training
    script's, whose batch size is its own and whose data loading is part of its iteration)."""
    notes = []
    scale = breakdown.attribution.scaled_by
    if breakdown.attribution.mode == EAGER_REPLAY:
        took = f"took {1 / scale:.1f}× as long as" if scale < 1 else "took no longer than"
        # On CUDA the peak is the compiled program's own (measure/memory.py, measure_program_memory).
        what = "per-line times come" if on_gpu else "per-line times and peak memory come"
        peak = " Its peak memory is the compiled program's own." if on_gpu else ""
        notes.append(
            f"The model is compiled (torch.compile): its {what} from an eager run "
            "of the same iteration, as the compiler's fused kernels belong to no line; that run's operations "
            f"{took} the compiled iteration, whose time is the one measured. Compare lines by their shares.{peak}"
        )
    elif scale < NOTABLE_SCALING:
        notes.append(
            f"Operations ran {1 / scale - 1:.0%} slower while recorded than in the measured iteration: "
            f"{_GPU_SLOWDOWN if on_gpu else _CPU_SLOWDOWN}, which weighs most on short operations. The per-line "
            f"times were scaled down to the measured iteration: compare lines by their shares; {_larger(script)} "
            "makes operations longer and the difference smaller."
        )
    elif scale > NOTABLE_WAIT:
        operations = (
            "its operations (each its thread's CPU time: the CPU was busy)"
            if breakdown.attribution.device_time == THREAD_CPU
            else "its operations"
        )
        notes.append(
            f"The measured iteration took {scale:.1f}× as long as {operations} and the Python between them took "
            "at their fastest while recorded: they waited, for a CPU that other processes kept busy (see the "
            "warnings) or for something the recorded iterations did not run. That time is shared out over the lines "
            "in proportion to their own, so that each line's share is its share of the unimpeded iteration: compare "
            "lines by their shares, or re-run on a quiet machine for their times there."
        )
    fallback = breakdown.attribution.device_time_fallback
    if fallback:
        notes.append(
            "Per-line times are the operations' spans on the GPU's stream (CUDA events), not their kernels' time: "
            f"{fallback}. A span follows the host's launches as much as the kernels: where the GPU waits for "
            "the host, short operations read longer than their kernels."
        )
    share = breakdown.attribution.user_lines_fraction
    if share is not None and share < LOW_ATTRIBUTION:
        notes.append(_little_on_user_lines(breakdown, share, script))
    return notes


def _larger(script: bool) -> str:
    """How to run a larger batch size, said as the one to try."""
    where = "the script's own option or literal, or --set-batch-size" if script else "--batch-size"
    return f"a larger batch size ({where})"


# On a quiet machine too (the default example, 1.1 to 1.4 times in fresh processes): between
# operations the recorder's own work lets OpenMP's threads stop spinning (measure/runtime.py
# can shorten their spin) and the caches cool, and the next operation pays to wake them.
_CPU_SLOWDOWN = (
    "between them the recorder's own work lets the CPU's threads idle and its caches cool (a busy machine adds more)"
)
# On an H200 the transformer example's kernels ran 0.68 ms of its 8.8 ms iteration: the GPU waits
# for the host, and each CUDA event span holds the operation's launch (bench/results-gpu.md).
_GPU_SLOWDOWN = (
    "each is timed by CUDA events around it, and while the recorder works between operations the GPU "
    "runs dry, so a span holds the host's launch of the kernel as well as the kernel (torch.profiler's "
    "kernel times leave it out)"
)


def _little_on_user_lines(breakdown: Breakdown, share: float, script: bool) -> str:
    """Where the time outside operations goes, as far as the recording tells: inside optimizer
    steps, it is the optimizer's own Python (LBFGS's line search and history, 76 % of a small
    model's iteration, was told to move data preparation into the input provider). A script's
    iteration holds its data loading, which workers take off the training loop; an entry point's
    input provider is not timed."""
    said = f"Only {share:.0%} of the iteration's time is in operations attributed to your lines; "
    larger = f"or use {_larger(script)} to spread that work over more samples."
    in_steps = breakdown.attribution.untracked_in_steps_fraction
    steps = sorted((line for line in breakdown.lines if line.step_ms > 0), key=lambda line: -line.step_ms)
    if in_steps is not None and in_steps >= MOSTLY and steps:
        return said + (
            f"most of the rest (untracked) passes inside optimizer steps ({steps[0].path}:{steps[0].line}) "
            "between their operations: the optimizer's own Python (a line search, a loop over many "
            f"parameters) and any closure it calls. Give the optimizer foreach=True where it takes it, {larger}"
        )
    if in_steps is None:  # not measured (CUDA): either may hold it
        where, optimizer = "your code's, or an optimizer's own", "give the optimizer foreach=True where it takes it, "
    else:
        where, optimizer = "your code's", ""
    move = (
        "load the data in a DataLoader's worker processes (num_workers), "
        if script
        else "move data preparation into the input provider (it is not timed), "
    )
    return said + (
        f"the rest (untracked) is Python work between operations ({where}), or work on other threads, "
        f"which the breakdown does not see: {move}{optimizer}{larger}"
    )
