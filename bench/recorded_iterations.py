"""How a fast model's breakdown combines its three recorded iterations: each operation's median
time (the engine's) against the mean of the three (the engine's before), side by side on the
very same recorded iterations, so the machine's drift between runs cannot favour either.

Each round is a fresh process in the user's environment, as an analysis is (measure/runtime.py): the
model is built and warmed up, one iteration is recorded (the first the recorder's code runs), the
batch size is timed, two more are recorded (attribute/recording.py), and then, as the reference, 21
more, of which the first is dropped and the others' mean taken per line (a recorder long warm,
averaged over many iterations). Then:

- each way's per-line shares of the recorded time against the reference's: their total
  variation distance (half the sum of the absolute differences; 0 is the same shares);
- each way's recorded time over the measured iteration (the lower quartile of its timing): above
  1.25 the document warns that operations ran notably slower while recorded.

    python bench/recorded_iterations.py [--rounds 5]

Prints a table and writes it between the recorded-iterations markers of bench/results.md.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

from sections import write_section

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results.md"
EXAMPLES = ("default", "cnn", "transformer")
REFERENCE_ITERATIONS = 21
NOTABLE = 1.25  # 1 / the engine's NOTABLE_SCALING


def one_round(example: str) -> dict[str, float]:
    """In this process: the model's recorded iterations combined both ways, and the reference."""
    import torch

    from skyline_engine.attribute.creation import CreationSites
    from skyline_engine.attribute.frames import CallSites
    from skyline_engine.attribute.recording import IterationRecording
    from skyline_engine.entry.loader import load_entry_point
    from skyline_engine.measure.compilation import eager_replay
    from skyline_engine.measure.iteration import IterationRunner
    from skyline_engine.measure.timing import TimingBudget

    root = REPO / "examples" / example
    entry = load_entry_point(root / "entry_point.py", root)
    device = torch.device("cpu")
    creation = CreationSites(CallSites(entry.files))
    with creation.recording_modules():
        runner = IterationRunner(entry, device, TimingBudget())
    with runner, runner.at_batch_size(entry.default_batch_size) as run:
        with creation.finding_optimizers(entry.relative_path):
            runner.warm_up(run)
        recording = IterationRecording(creation, runner.model, device)
        memory, _ = recording.record_first(run, runner.clock, runner.live_tensors)
        timing = runner.time(run, entry.default_batch_size)
        recording.record_more(run, timing.run_time_ms)
        reference = IterationRecording(creation, runner.model, device)
        with eager_replay(), reference.recorder:
            for _ in range(REFERENCE_ITERATIONS):
                reference.recorder.start_iteration()
                run()
    records = recording.recorder.recording
    if len(records.iteration_starts) < 3:
        raise SystemExit(f"{example}: {len(records.iteration_starts)} iteration(s) recorded; this compares three")
    mean = _line_times(records.operations, len(records.iteration_starts))
    median = {
        (line.path, line.line): line.forward_ms + line.backward_ms + line.step_ms
        for line in recording.breakdown(float("inf"), memory.peak_bytes).lines
    }
    later = reference.recorder.recording
    truth = _line_times(later.operations[later.iteration_starts[1] :], REFERENCE_ITERATIONS - 1)
    return {
        "measured_ms": timing.run_time_ms,
        "mean_ratio": sum(mean.values()) / timing.run_time_ms,
        "median_ratio": sum(median.values()) / timing.run_time_ms,
        "mean_distance": _distance(mean, truth),
        "median_distance": _distance(median, truth),
    }


def _line_times(operations, iterations: int) -> dict:
    """Each line's own time per iteration, the operations' times averaged (the engine's before)."""
    times: dict = defaultdict(float)
    for op in operations:
        if op.context is not None:
            times[op.context] += op.duration_ms / iterations
    return times


def _distance(times: dict, truth: dict) -> float:
    total, true_total = sum(times.values()), sum(truth.values())
    lines = set(times) | set(truth)
    return sum(abs(times.get(k, 0.0) / total - truth.get(k, 0.0) / true_total) for k in lines) / 2


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--one", choices=EXAMPLES, help=argparse.SUPPRESS)  # a round, in its own process
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one_round(args.one)))
        return
    results: dict[str, list[dict[str, float]]] = {example: [] for example in EXAMPLES}
    for n in range(args.rounds):
        for example in EXAMPLES if n % 2 == 0 else reversed(EXAMPLES):
            out = subprocess.run(
                [sys.executable, __file__, "--one", example],
                capture_output=True,
                text=True,
                check=True,
                cwd=REPO,
            )
            results[example].append(json.loads(out.stdout.splitlines()[-1]))
            print(example, results[example][-1], file=sys.stderr)
    rows = [
        "| model | per-line shares against the reference: mean of three | median of three | "
        "recorded / measured: mean | median | rounds above 1.25: mean | median |",
        "|---|---|---|---|---|---|---|",
    ]
    for example, rounds in results.items():

        def med(key: str, rounds: list[dict[str, float]] = rounds) -> float:
            return statistics.median(r[key] for r in rounds)

        def above(key: str, rounds: list[dict[str, float]] = rounds) -> str:
            return f"{sum(r[key] > NOTABLE for r in rounds)} of {len(rounds)}"

        rows.append(
            f"| {example} | {med('mean_distance'):.1%} | {med('median_distance'):.1%} | "
            f"{med('mean_ratio'):.2f} | {med('median_ratio'):.2f} | {above('mean_ratio')} | {above('median_ratio')} |"
        )
    table = "\n".join(
        [
            "A fast model's three recorded iterations combined per operation by their mean (the engine's before) "
            "and by their median (the engine's now), on the very same iterations; the reference is 20 more "
            f"recorded iterations of a warm recorder, averaged. On {platform.node() or 'this machine'} "
            f"({platform.machine()}); medians of {args.rounds} rounds, each a fresh process "
            "(python bench/recorded_iterations.py). Share distance: half the sum over lines of the absolute "
            "difference in share of the recorded time (0 %: the reference's shares).",
            "",
            *rows,
        ]
    )
    print(table)
    write_section(RESULTS, "recorded-iterations", "Combining the recorded iterations", table)


if __name__ == "__main__":
    main()
