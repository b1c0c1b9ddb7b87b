"""Baseline for bench/fidelity.py: the user's own training loop, timed the way a user would time it.

    python bench/baselines/plain_loop.py ENTRY --batch-size N [--warmup 3] [--min-iterations 10]
                                         [--min-seconds 2] [--max-seconds 60]

Loads the entry point, builds the model, the iteration and the inputs (the input provider called
with `batch_size=N`) exactly as a training script would: no default device, no environment
changes, no allocator settings. Runs `--warmup` iterations, then times iterations one by one
until it has at least `--min-iterations` and `--min-seconds`, or `--max-seconds` of timing with at
least 3 iterations (a slow iteration: fewer than asked, bounded), and prints one JSON object: the
mean and the median milliseconds per iteration, how many were timed, torch's version and
threads, and whether the threads waited for a core at every parallel region (the engine's probe,
after the timing).
"""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bare_iteration import load


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("entry", type=Path)
    parser.add_argument("--batch-size", type=int, required=True)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--min-iterations", type=int, default=10)
    parser.add_argument("--min-seconds", type=float, default=2.0)
    parser.add_argument("--max-seconds", type=float, default=60.0)
    args = parser.parse_args()
    import torch

    from skyline_engine.measure.thread_waits import thread_waits

    module = load(args.entry.resolve())
    model = module.skyline_model_provider()
    iteration = module.skyline_iteration_provider(model)
    inputs = module.skyline_input_provider(batch_size=args.batch_size)

    for _ in range(args.warmup):
        iteration(*inputs)
    times_ms = []
    clock = time.perf_counter
    started = clock()
    while True:
        start = clock()
        iteration(*inputs)
        end = clock()
        times_ms.append((end - start) * 1000)
        elapsed = end - started
        enough = len(times_ms) >= args.min_iterations and elapsed >= args.min_seconds
        if enough or (elapsed >= args.max_seconds and len(times_ms) >= 3):
            break
    print(
        json.dumps(
            {
                "batch_size": args.batch_size,
                "mean_ms": statistics.fmean(times_ms),
                "median_ms": statistics.median(times_ms),
                "min_ms": min(times_ms),
                "iterations": len(times_ms),
                "timed_seconds": elapsed,
                "torch_version": torch.__version__,
                "torch_threads": torch.get_num_threads(),
                # Whether this process's threads waited for a core at every parallel region, probed
                # after the timing as an analysis probes (measure/thread_waits.py): null when not.
                "threads_waited_ms": waits.region_ms if (waits := thread_waits(torch.device("cpu"))) else None,
            }
        )
    )


if __name__ == "__main__":
    main()
