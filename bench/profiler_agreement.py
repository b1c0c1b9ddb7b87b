"""Per-line forward times against torch.profiler on the same model, side by side in one run.

tests/projects/annotated wraps each of its three forward lines in `record_function`, so
torch.profiler reports each line's forward time as the CPU time of its range; the engine finds
the lines on its own. Compared: each line's share of the three lines' forward time (two runs on a
shared machine differ in speed; shares much less), in interleaved rounds (engine, profiler,
profiler, engine, ...). The profiler's ranges also hold the Python work of calling the modules,
which the engine leaves to `untracked`. (Which operations each line ran, exactly and without
timing, is tests/test_breakdown_vs_torch_profiler.py.)

    python bench/profiler_agreement.py [--rounds 5]

Prints a table and writes it between the profiler-agreement markers of bench/results.md.
"""

from __future__ import annotations

import argparse
import gc
import platform
import statistics
import sys
from pathlib import Path

from sections import write_section
from torch.profiler import ProfilerActivity, profile, schedule

from skyline_engine.analysis.session import AnalysisRequest, analyze
from skyline_engine.measure.timing import TimingBudget

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results.md"
sys.path.insert(0, str(REPO / "tests"))
from annotated_model import PROJECT, iteration_and_inputs, marker_lines  # noqa: E402 - tests/, on the path above

PROFILED_ITERATIONS = 5


def profiler_forward_ms() -> dict[str, float]:
    iteration, inputs = iteration_and_inputs()
    for _ in range(3):
        iteration(*inputs)
    # The profiler's own warm-up step is left out (its first range carries a setup cost), and the
    # garbage collector is held off as timeit does: a collection landing in one line's range made
    # it 0.6 ms longer in about half the runs.
    totals: dict[str, float] = {}

    def collect(prof) -> None:
        for event in prof.key_averages():
            if event.key.startswith("LINE_"):
                totals[event.key] = event.cpu_time_total / 1000.0 / PROFILED_ITERATIONS

    steps = schedule(wait=0, warmup=1, active=PROFILED_ITERATIONS, repeat=1)
    gc.collect()
    gc.disable()
    try:
        with profile(activities=[ProfilerActivity.CPU], schedule=steps, on_trace_ready=collect) as prof:
            for _ in range(1 + PROFILED_ITERATIONS):
                iteration(*inputs)
                prof.step()
    finally:
        gc.enable()
    return totals


def engine_forward_ms(lines: dict[str, int]) -> dict[str, float]:
    budget = TimingBudget(min_run_s=0.3)
    request = AnalysisRequest("entry_point.py", PROJECT, device="cpu", budget=budget, predict=False)
    ours = {(e["path"], e["line"]): e["forward_ms"] for e in analyze(request).to_dict()["lines"]}
    return {marker: ours[("entry_point.py", number)] for marker, number in lines.items()}


def shares(times: dict[str, float]) -> dict[str, float]:
    total = sum(times.values())
    return {marker: value / total for marker, value in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    lines = marker_lines()
    ours: list[dict[str, float]] = []
    theirs: list[dict[str, float]] = []
    for n in range(args.rounds):
        for who in ("engine", "profiler") if n % 2 == 0 else ("profiler", "engine"):
            if who == "engine":
                ours.append(shares(engine_forward_ms(lines)))
            else:
                theirs.append(shares(profiler_forward_ms()))
    rows = ["| line | engine's share | torch.profiler's share | engine / profiler |", "|---|---|---|---|"]
    for marker in lines:
        mine = statistics.median(r[marker] for r in ours)
        reference = statistics.median(r[marker] for r in theirs)
        rows.append(f"| `{marker}` | {mine:.1%} | {reference:.1%} | {mine / reference:.2f} |")
    table = "\n".join(
        [
            f"Each line's share of the three lines' forward time, engine against torch.profiler's "
            f"`record_function` ranges (CPU time), on {platform.node() or 'this machine'} "
            f"({platform.processor() or platform.machine()}); medians of {args.rounds} interleaved "
            "rounds (python bench/profiler_agreement.py).",
            "",
            *rows,
        ]
    )
    print(table)
    write_section(RESULTS, "profiler-agreement", "Per-line times against torch.profiler", table)


if __name__ == "__main__":
    main()
