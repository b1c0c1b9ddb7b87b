"""A compiled model against the same model uncompiled, side by side in one run: the transformer
example with `torch.compile` (bench/models/compiled_transformer) and as it is, each analysed cold
(`skyline profile` in a fresh process, with an empty inductor cache: compiling from scratch, as
the first analysis of a compiled model does), in interleaved rounds.

    python bench/compiled.py [--rounds 2]

Prints a table and writes it between the compiled markers of bench/results.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from sections import write_section

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results.md"
COMPILED = (REPO / "bench" / "models" / "compiled_transformer", "entry_point.py")
EAGER = (REPO / "examples" / "transformer", "entry_point.py")


def analyse(root: Path, entry: str) -> dict[str, Any]:
    """A cold analysis: its document, and its wall time (the process's, imports included)."""
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "analysis.json"
        command = [sys.executable, "-m", "skyline_engine", "profile", entry, "--device", "cpu", "--quiet"]
        command += ["--json", str(out)]
        env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(Path(folder) / "inductor"))
        started = time.perf_counter()
        subprocess.run(command, cwd=root, env=env, check=True, capture_output=True, timeout=900)
        wall_s = time.perf_counter() - started
        return {"document": json.loads(out.read_text()), "wall_s": wall_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    runs: dict[str, list[dict[str, Any]]] = {"compiled": [], "eager": []}
    for n in range(args.rounds):
        for name in ("compiled", "eager") if n % 2 == 0 else ("eager", "compiled"):
            runs[name].append(analyse(*(COMPILED if name == "compiled" else EAGER)))
    table = _table(runs, args.rounds)
    print(table)
    write_section(RESULTS, "compiled", "A compiled model", table)


def _median(runs: list[dict[str, Any]], figure: Any) -> float:
    return statistics.median(figure(run) for run in runs)


def _table(runs: dict[str, list[dict[str, Any]]], rounds: int) -> str:
    compiled, eager = runs["compiled"], runs["eager"]
    doc = compiled[0]["document"]

    def iteration(run: dict[str, Any]) -> float:
        return float(run["document"]["iteration"]["run_time_ms"])

    def peak(run: dict[str, Any]) -> float:
        return float(run["document"]["iteration"]["peak_memory_bytes"])

    def compile_s(run: dict[str, Any]) -> float:
        return float(run["document"]["compilation"]["seconds"])

    rows = [
        (
            "cold analysis",
            f"{_median(compiled, lambda r: r['wall_s']):.1f} s",
            f"{_median(eager, lambda r: r['wall_s']):.1f} s",
        ),
        ("of which compiling (reported apart)", f"{_median(compiled, compile_s):.1f} s", "—"),
        (
            "graphs compiled",
            f"{doc['compilation']['graphs']} ({len(doc['compilation']['batch_sizes'])} batch sizes)",
            "—",
        ),
        ("iteration at batch size 16", f"{_median(compiled, iteration):.1f} ms", f"{_median(eager, iteration):.1f} ms"),
        ("peak memory", f"{_median(compiled, peak) / 2**20:.1f} MiB", f"{_median(eager, peak) / 2**20:.1f} MiB"),
        ("attribution", doc["attribution"]["mode"], eager[0]["document"]["attribution"]["mode"]),
    ]
    lines = [
        f"torch.compile, {platform.processor() or platform.machine()}, {os.cpu_count()} cores, inductor CPU backend "
        f"with an empty cache; medians of {rounds} interleaved rounds (python bench/compiled.py).",
        "",
        "| the transformer example | compiled | uncompiled |",
        "|---|---|---|",
        *(f"| {name} | {a} | {b} |" for name, a, b in rows),
        "",
        "Compiling happens in the warm-ups of each batch size and is reported apart; the timed iterations "
        "run the compiled code. The peak memory and the per-line breakdown come from an eager replay of "
        "the same iteration (docs/analysis-document.md, `compilation`).",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
