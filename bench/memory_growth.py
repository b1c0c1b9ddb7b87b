"""What the check for memory kept for good (measure/retention.py) adds to an analysis: its three
noted iterations against three plain ones of the same example, side by side in one process, in
interleaved rounds (plain, check, plain, check, ...), medians compared.

    python bench/memory_growth.py [--rounds 5]

Prints a table and writes it between the memory-growth markers of bench/results.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import torch
from sections import write_section

from skyline_engine.entry.loader import load_entry_point
from skyline_engine.measure.device import describe_device
from skyline_engine.measure.iteration import IterationRunner
from skyline_engine.measure.retention import RETENTION_ITERATIONS, measure_retention
from skyline_engine.measure.timing import TimingBudget

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results.md"
EXAMPLES = ("default", "cnn", "transformer")


def one_example(name: str, rounds: int) -> tuple[float, float, int]:
    """Medians of `rounds` interleaved rounds (seconds): RETENTION_ITERATIONS plain iterations, the
    check; and the bytes it found kept (0 for the examples)."""
    root = REPO / "examples" / name
    entry = load_entry_point(root / "entry_point.py", root)
    try:
        runner = IterationRunner(entry, torch.device("cpu"), TimingBudget())
        with runner, runner.at_batch_size(entry.default_batch_size) as run:
            for _ in range(3):  # steady state: the optimizer's state exists
                run()
            plain, checked, kept = [], [], 0
            for _ in range(rounds):
                started = time.perf_counter()
                for _ in range(RETENTION_ITERATIONS):
                    run()
                plain.append(time.perf_counter() - started)
                started = time.perf_counter()
                kept = measure_retention(run, runner.model, runner.device, runner.live_tensors).bytes_per_iteration
                checked.append(time.perf_counter() - started)
        return statistics.median(plain), statistics.median(checked), kept
    finally:
        entry.unload()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    rows = [
        "| example | 3 plain iterations | the check | check / plain | kept per iteration |",
        "|---|---|---|---|---|",
    ]
    for name in EXAMPLES:
        plain, checked, kept = one_example(name, args.rounds)
        rows.append(f"| {name} | {plain * 1000:.1f} ms | {checked * 1000:.1f} ms | {checked / plain:.2f} | {kept} B |")
    cpu = describe_device(torch.device("cpu")).name
    body = (
        f"Medians of {args.rounds} interleaved rounds in one process, {cpu} ({os.cpu_count()} cores), torch "
        f"{torch.__version__}, {time.strftime('%Y-%m-%d')}. The check runs once per analysis, after the user's "
        "batch size is timed.\n\n" + "\n".join(rows) + "\n"
    )
    print(body)
    write_section(RESULTS, "memory-growth", "The check for memory kept for good", body)


if __name__ == "__main__":
    main()
