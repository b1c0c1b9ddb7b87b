"""Does a straight line through batch sizes timed each in a process of its own predict a larger one?

    python bench/own_process_line.py [--model vit] [--sizes 16,32,64] [--target 256] [--rounds 2]

Plain loops of one of bench/fidelity.py's models (as bench/baselines/plain_loop.py runs them), each
batch size in a fresh process of its own, in the state its own training reaches (glibc's malloc
thresholds as that batch size leaves them: bench/allocator_state.py): the mean time an iteration
and the minor page faults an iteration (getrusage). The line through `--sizes` is then asked for
`--target` and compared with the target's own processes. Where they differ, the time does not
grow in a straight line past the sizes, whatever the allocator's state: what the trusted range
must not extend over unchecked (`models.range_probed_to`). Prints a table and writes it between
the own-process-line markers of bench/results.md.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
from allocator_state import fresh_child, timed_with_faults
from fidelity import MODELS
from sections import write_section

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results.md"
SETTLE_S, TIMED_S = 1.5, 3.0  # the process settles in first (its first seconds run at another speed)


def child(entry: Path, batch_size: int) -> None:
    """One fresh process at one batch size: prints its mean ms and median faults an iteration."""
    sys.path.insert(0, str(HERE / "baselines"))
    from bare_iteration import load

    module = load(entry.resolve())
    iteration = module.skyline_iteration_provider(module.skyline_model_provider())
    inputs = module.skyline_input_provider(batch_size=batch_size)

    timed_with_faults(iteration, inputs, SETTLE_S, 3)
    print(json.dumps(timed_with_faults(iteration, inputs, TIMED_S, 5)))


def own_process(entry: str, batch_size: int) -> dict:
    return fresh_child(__file__, [entry, str(batch_size)], 900)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="vit", choices=sorted(MODELS))
    parser.add_argument("--sizes", default="16,32,64")
    parser.add_argument("--target", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--child", nargs=2, metavar=("ENTRY", "BATCH_SIZE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(Path(args.child[0]), int(args.child[1]))
        return
    sizes = [int(b) for b in args.sizes.split(",")]
    lines = [
        f"{args.model}: each batch size in a fresh process of its own, {args.rounds} round(s); mean ms an iteration "
        f"(median minor page faults an iteration), and the line through {args.sizes} asked for {args.target} "
        "(python bench/own_process_line.py).",
        "",
        f"| round | {' | '.join(map(str, sizes))} | {args.target} | line at {args.target} | error |",
        f"|---|{'--:|' * (len(sizes) + 3)}",
    ]
    for round_ in range(1, args.rounds + 1):
        runs = {b: own_process(MODELS[args.model], b) for b in [*sizes, args.target]}
        slope, bias = np.polyfit(sizes, [runs[b]["ms"] for b in sizes], 1)
        line = slope * args.target + bias
        cells = " | ".join(f"{runs[b]['ms']:,.1f} ({runs[b]['faults']:,.0f})" for b in [*sizes, args.target])
        lines.append(f"| {round_} | {cells} | {line:,.1f} | {line / runs[args.target]['ms'] - 1:+.1%} |")
    body = "\n".join(lines)
    print(body)
    write_section(RESULTS, "own-process-line", "A line through batch sizes each in its own process", body)


if __name__ == "__main__":
    main()
