"""How much an iteration's time on the CPU depends on what ran before it in the process: glibc
malloc's thresholds (skyline_engine/measure/allocator.py), left as a training process has them.

    python bench/allocator_state.py [--rounds 3] [--models cnn,vit]

In fresh processes, plain loops of each model's iteration (as bench/baselines/plain_loop.py runs
it): at the user's batch size twice (the second, as long into the process as the last, is what it
is compared with), then a few iterations at a larger one, then the user's again. Each time with
the minor page faults per iteration (getrusage): glibc hands large blocks back to the
kernel and faults them in again, until a larger block freed raises its thresholds for the rest
of the process. An analysis times the models' batch sizes after larger ones have run (its memory
probes, the interleaved rounds), so a difference here is one between the models' rounds and the
user's own training at that batch size.

Each round also runs the same child with glibc's thresholds set in its environment
(MALLOC_MMAP_THRESHOLD_ and MALLOC_TRIM_THRESHOLD_, the values `--settle-runtime` pins): the user's
training as they could run it, which is what the engine's warning of two malloc states proposes.
The spread over the fresh processes (max - min over the median) says how far runs of the very same
training differ with the state each process happens to reach. Prints a table and writes it
between the allocator-state markers of bench/results.md.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

from fidelity import MODELS
from sections import write_section

from skyline_engine.measure.allocator import SETTLED_ENVIRONMENT

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results.md"
# For each of bench/fidelity.py's models, the larger batch size run in between (about the largest
# its analysis times or probes).
LARGER = {"default": 1024, "cnn": 256, "transformer": 64, "gpt": 64, "vit": 128}
TIMED_S = 1.5  # of each measurement at the user's batch size (at least 5 iterations)


def timed_with_faults(iteration: Callable[..., object], inputs: tuple, seconds: float, least: int) -> dict:
    """`iteration(*inputs)` timed one by one for at least `seconds` and `least` iterations: the mean
    ms and the median minor page faults (getrusage) an iteration."""
    times, faults = [], []
    started = time.perf_counter()
    while time.perf_counter() - started < seconds or len(times) < least:
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        start = time.perf_counter()
        iteration(*inputs)
        times.append((time.perf_counter() - start) * 1000)
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    return {"ms": statistics.fmean(times), "faults": statistics.median(faults)}


def child(entry: Path, larger: int) -> None:
    """One fresh process: the user's batch size twice, the larger one, the user's again; prints JSON."""
    sys.path.insert(0, str(HERE / "baselines"))
    from bare_iteration import load

    module = load(entry.resolve())
    model = module.skyline_model_provider()
    iteration = module.skyline_iteration_provider(model)
    users = module.skyline_input_provider()  # its default: the user's batch size
    batch_size = len(users[0])

    def measure(inputs: tuple, seconds: float, least: int) -> dict:
        for _ in range(3):
            iteration(*inputs)
        return timed_with_faults(iteration, inputs, seconds, least)

    measure(users, TIMED_S, 5)  # the process settles in (its first seconds run at another speed)
    fresh = measure(users, TIMED_S, 5)
    measure(module.skyline_input_provider(batch_size=larger), 0.0, 2)
    after = measure(users, TIMED_S, 5)
    print(json.dumps({"batch_size": batch_size, "fresh": fresh, "after": after}))


def fresh_child(script: str, arguments: list[str], timeout: float, environment: dict[str, str] | None = None) -> dict:
    """`script --child ARGUMENTS` in a fresh process (from the repository's root): the JSON object
    its last line prints."""
    out = subprocess.run(
        [sys.executable, script, "--child", *arguments],
        cwd=HERE.parent,
        env=environment,
        capture_output=True,
        text=True,
        check=True,
        timeout=timeout,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def one_child(entry: str, larger: int, settled: bool) -> dict:
    """A fresh process of `child`; `settled`: with glibc's thresholds set in its environment."""
    environment = {**os.environ, **(SETTLED_ENVIRONMENT if settled else {})}
    return fresh_child(__file__, [entry, str(larger)], 600, environment)


def nproc() -> int:
    return len(os.sched_getaffinity(0))


def spread(values: list[float]) -> float:
    """Max - min over the median: how far fresh processes of the same loop differ."""
    return (max(values) - min(values)) / statistics.median(values)


def one_model(name: str, rounds: int) -> dict:
    entry, larger = MODELS[name], LARGER[name]
    runs, settled = [], []
    for count in range(rounds):  # the two environments alternate which runs first
        for is_settled in (False, True) if count % 2 == 0 else (True, False):
            (settled if is_settled else runs).append(one_child(entry, larger, is_settled))
    changes = [r["after"]["ms"] / r["fresh"]["ms"] - 1 for r in runs]
    return {
        "batch_size": runs[0]["batch_size"],
        "larger": larger,
        "fresh_ms": statistics.median(r["fresh"]["ms"] for r in runs),
        "fresh_faults": statistics.median(r["fresh"]["faults"] for r in runs),
        "fresh_spread": spread([r["fresh"]["ms"] for r in runs]),
        "fresh_faults_each": [r["fresh"]["faults"] for r in runs],
        "after_ms": statistics.median(r["after"]["ms"] for r in runs),
        "after_faults": statistics.median(r["after"]["faults"] for r in runs),
        "changes": changes,
        "settled_ms": statistics.median(r["fresh"]["ms"] for r in settled),
        "settled_faults": statistics.median(r["fresh"]["faults"] for r in settled),
        "settled_spread": spread([r["fresh"]["ms"] for r in settled]),
    }


def table(results: dict[str, dict], rounds: int) -> str:
    settings = " ".join(f"{name}={value}" for name, value in SETTLED_ENVIRONMENT.items())
    lines = [
        f"{time.strftime('%Y-%m-%d')}, {nproc()} cores. Plain loops on the CPU, {rounds} fresh processes each, "
        "medians: the user's batch size as its own "
        "training runs it on glibc's default malloc (timed a second time, after the process settled in; the "
        "spread is max - min over the median across the processes, with each process's page faults), then "
        "after a few iterations of a larger one (the state an analysis's later rounds time it in); and the "
        f"same training in processes started with `{settings}` (glibc's own settings, what the engine's "
        "warning of two malloc states proposes). Minor page faults per iteration beside each (python "
        "bench/allocator_state.py).",
        "",
        "| model | batch | its own training: ms (faults), spread over processes (their faults) "
        "| after the larger: ms (faults) | change (each process) | with glibc's thresholds set: ms (faults), spread "
        "| change |",
        "|---|--:|--:|--:|---|--:|--:|",
    ]
    for name, r in results.items():
        each = ", ".join(f"{c:+.0%}" for c in r["changes"])
        faults_each = ", ".join(f"{f:,.0f}" for f in r["fresh_faults_each"])
        lines.append(
            f"| {name} | {r['batch_size']} (then {r['larger']}) | {r['fresh_ms']:.2f} ({r['fresh_faults']:,.0f}), "
            f"±{r['fresh_spread']:.0%} ({faults_each}) "
            f"| {r['after_ms']:.2f} ({r['after_faults']:,.0f}) | {statistics.median(r['changes']):+.0%} ({each}) "
            f"| {r['settled_ms']:.2f} ({r['settled_faults']:,.0f}), ±{r['settled_spread']:.0%} "
            f"| {r['settled_ms'] / r['fresh_ms'] - 1:+.0%} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--child", nargs=2, metavar=("ENTRY", "LARGER"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(Path(args.child[0]), int(args.child[1]))
        return
    results = {name: one_model(name, args.rounds) for name in args.models.split(",")}
    body = table(results, args.rounds)
    print(body)
    write_section(RESULTS, "allocator-state", "How an iteration's time depends on what ran before it", body)


if __name__ == "__main__":
    main()
