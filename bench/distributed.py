"""Data-parallel training on this machine, side by side in one run: each model analysed on 1 rank
(torchrun, one thread, as each of 2 ranks gets) and on 2 ranks (`skyline profile --nproc 2`), in
interleaved rounds; then the throughput at 2 ranks predicted from the 1-rank analysis plus the
link measured by the 2-rank run's all-reduces alone, against the one measured at 2 ranks.

    python bench/distributed.py [--rounds 3]

Prints a table and writes it between the data-parallel markers of bench/results.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from sections import write_section

from skyline_engine.predict.scaling import BucketTiming, Link, predict_scaling

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results.md"
MODELS = {
    "cnn": (REPO / "examples" / "cnn", "entry_point.py"),
    "wide MLP (2.3 MiB of gradients)": (REPO / "tests" / "projects" / "data_parallel", "entry_point.py"),
}
TARGET_ERROR = 0.15


def analyse(root: Path, entry: str, ranks: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "analysis.json"
        if ranks == 1:
            command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "1"]
            command += ["-m", "skyline_engine", "profile", entry]
        else:
            command = [sys.executable, "-m", "skyline_engine", "profile", entry, "--nproc", str(ranks)]
        command += ["--device", "cpu", "--quiet", "--json", str(out)]
        env = dict(os.environ, OMP_NUM_THREADS="1")
        subprocess.run(command, cwd=root, env=env, check=True, capture_output=True, timeout=600)
        return json.loads(out.read_text())["distributed"]  # type: ignore[no-any-return]


def predicted_at_two(one: dict[str, Any], two: dict[str, Any], batch_size: int) -> float:
    """Throughput at 2 ranks from the 1-rank analysis (computation, when each bucket is ready) and
    the 2-rank run's link alone (no in-iteration all-reduce of 2 ranks enters)."""
    link = two["link"]
    measured_link = Link(
        latency_ms=link["latency_us"] / 1000,
        bandwidth_bytes_per_ms=link["bandwidth_gbps"] * 1e9 / 8 / 1000,
        source="measured",
        description=link["description"],
    )
    buckets = [BucketTiming(b["index"], b["size_bytes"], b["ready_ms"], b["all_reduce_ms"]) for b in one["buckets"]]
    rows = predict_scaling(
        compute_ms=one["communication"]["compute_ms"],
        backward_end_ms=one["communication"]["backward_end_ms"],
        buckets=buckets,
        link=measured_link,
        batch_size_per_rank=batch_size,
        measured_world_size=1,
    )
    return next(r.samples_per_second for r in rows if r.world_size == 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    rows = []
    for name, (root, entry) in MODELS.items():
        runs: dict[int, list[dict[str, Any]]] = {1: [], 2: []}
        for n in range(args.rounds):
            for ranks in (1, 2) if n % 2 == 0 else (2, 1):
                runs[ranks].append(analyse(root, entry, ranks))
        batch_size = _batch_size(root, entry)
        errors, one_ms, two_ms, exposed, predicted, measured = [], [], [], [], [], []
        for one, two in zip(runs[1], runs[2]):
            one_ms.append(one["ranks"][0]["run_time_ms"])
            two_ms.append(max(r["run_time_ms"] for r in two["ranks"]))
            exposed.append(two["communication"]["exposed_ms"])
            p = predicted_at_two(one, two, batch_size)
            m = next(r["measured_samples_per_second"] for r in two["scaling"] if r["world_size"] == 2)
            predicted.append(p)
            measured.append(m)
            errors.append(abs(p - m) / m)
        rows.append(
            {
                "model": name,
                "buckets": len(runs[2][0]["buckets"]),
                "one_rank_ms": statistics.median(one_ms),
                "two_ranks_ms": statistics.median(two_ms),
                "exposed_ms": statistics.median(exposed),
                "predicted": statistics.median(predicted),
                "measured": statistics.median(measured),
                "error": statistics.median(errors),
                "errors": errors,
            }
        )
    table = _table(rows, args.rounds)
    print(table)
    write_section(RESULTS, "data-parallel", "Data-parallel training", table)


def _batch_size(root: Path, entry: str) -> int:
    """The input provider's default: what each rank analyses."""
    match = re.search(r"batch_size=(\d+)", (root / entry).read_text())
    assert match, entry
    return int(match.group(1))


def _table(rows: list[dict[str, Any]], rounds: int) -> str:
    lines = [
        f"Data-parallel training, {platform.processor() or platform.machine()}, {os.cpu_count()} cores, gloo over "
        f"loopback, 1 thread per rank; medians of {rounds} interleaved rounds (python bench/distributed.py).",
        "",
        "| model | buckets | 1 rank: iteration | 2 ranks: iteration | 2 ranks: exposed communication | "
        "2 ranks: predicted from 1 rank + link | 2 ranks: measured | error (each round) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        each = ", ".join(f"{e:.1%}" for e in r["errors"])
        lines.append(
            f"| {r['model']} | {r['buckets']} | {r['one_rank_ms']:.1f} ms | {r['two_ranks_ms']:.1f} ms "
            f"({r['two_ranks_ms'] / r['one_rank_ms']:.2f}×) | {r['exposed_ms']:.1f} ms | "
            f"{r['predicted']:,.0f} samples/s | {r['measured']:,.0f} samples/s | {r['error']:.1%} ({each}) |"
        )
    lines.append("")
    lines.append(f"Target: error within {TARGET_ERROR:.0%}.")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
