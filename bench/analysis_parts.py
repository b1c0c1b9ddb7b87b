"""Where a cold analysis spends its time, part by part: what decides how to make it faster
(issue "Fast enough to stay interactive").

    python bench/analysis_parts.py [--models default,cnn,transformer] [--rounds 3]

Each round runs every model in a fresh process of its own, one after another (the rounds
interleave the models), in the user's environment, as `skyline profile ENTRY --device cpu`
does: importing torch, its compiler and the engine, then the analysis, its parts told apart by the
progress it reports (the phase names, batch sizes left out) and by its partial documents (the
first per-line result; the user's batch size timed in full). Prints, per model, the median
seconds of each part over the rounds and its share of the whole, and writes the table between
the analysis-parts markers of bench/results.md.
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

from sections import write_section

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results.md"
EXAMPLES = ("default", "cnn", "transformer")  # of bench/run.py's models
# The parts a partial document ends: the first per-line result, then the user's batch size timed.
PARTIAL_PARTS = ("first per-line result", "user's batch size timed in full")


def part_of(phase: str) -> str:
    """A progress phase without its batch sizes: `timing batch sizes 64, 128, 256 together` is
    `timing batch sizes N together`."""
    return re.sub(r"\d+(?:,\d{3})*(?:, \d+(?:,\d{3})*)*", "N", phase)


def child(entry: str) -> None:
    """One cold analysis, in this process: the parts' seconds, as JSON on stdout."""
    started = time.perf_counter()
    parts: list[tuple[str, float]] = []
    mark = [started]

    def ended(part: str) -> None:
        now = time.perf_counter()
        parts.append((part, now - mark[0]))
        mark[0] = now

    from skyline_engine.measure.frozen_imports import imported_and_frozen

    # As the program imports them (cli/__init__.py, `_import_the_analysis`).
    with imported_and_frozen(collect=False):
        import torch

        ended("importing torch")
        import torch._dynamo  # noqa: F401

        ended("importing its compiler")
        from skyline_engine.analysis.session import AnalysisRequest, analyze
    ended("importing the engine")
    current = ["loading the entry point"]
    partials = iter(PARTIAL_PARTS)

    def progress(phase: str, fraction: float) -> None:
        name = part_of(phase)
        if name != current[0]:
            ended(current[0])
            current[0] = name

    def partial(document: object) -> None:
        ended(f"{current[0]}: to the {next(partials, 'next partial document')}")

    analyze(AnalysisRequest(entry, REPO, device="cpu"), progress, partial)
    ended(current[0])
    print(json.dumps({"parts": parts, "total_s": time.perf_counter() - started}))


def measure(names: list[str], rounds: int) -> dict[str, list[dict]]:
    # The bench's entry points, and the engine as installed (compiled once); here, not at the top:
    # run.py imports torch.
    from run import INSTALLED, MODELS, byte_compile_engine

    byte_compile_engine()
    runs: dict[str, list[dict]] = {name: [] for name in names}
    for round_ in range(rounds):
        for name in names:
            out = subprocess.run(
                [sys.executable, __file__, "--child", MODELS[name]],
                cwd=REPO,
                env=INSTALLED,
                capture_output=True,
                text=True,
                check=True,
                timeout=600,
            ).stdout
            run = json.loads(out.strip().splitlines()[-1])
            runs[name].append(run)
            print(f"round {round_ + 1} {name}: {run['total_s']:.2f} s", file=sys.stderr)
    return runs


def table(runs: dict[str, list[dict]]) -> str:
    rows = ["| model | part | median s | share |", "|---|---|--:|--:|"]
    for name, measured in runs.items():
        total = statistics.median(run["total_s"] for run in measured)
        order: list[str] = []
        seconds: dict[str, list[float]] = {}
        for run in measured:
            summed: dict[str, float] = {}
            for part, s in run["parts"]:
                summed[part] = summed.get(part, 0.0) + s
                if part not in order:
                    order.append(part)
            for part, s in summed.items():
                seconds.setdefault(part, []).append(s)
        for part in order:
            median = statistics.median(seconds[part] + [0.0] * (len(measured) - len(seconds[part])))
            rows.append(f"| {name} | {part} | {median:.2f} | {median / total:.0%} |")
        rows.append(f"| {name} | **the whole analysis, from the process's start** | **{total:.2f}** | 100% |")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(EXAMPLES), help="of bench/run.py's models")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child)
        return
    names = [name for name in args.models.split(",") if name]
    runs = measure(names, args.rounds)
    body = (
        f"Cold analyses (`skyline profile ENTRY --device cpu`, in-process), {args.rounds} fresh processes a model, "
        f"interleaved; medians. On {platform.node() or 'this machine'}, {time.strftime('%Y-%m-%d')} "
        "(`python bench/analysis_parts.py`). A phase's time runs to the next phase; where a partial document "
        "is sent within a phase, the part up to it is its own row.\n\n" + table(runs)
    )
    print(body)
    write_section(RESULTS, "analysis-parts", "Where a cold analysis spends its time", body)


if __name__ == "__main__":
    main()
