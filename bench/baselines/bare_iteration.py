"""Baseline (a): a cold process that builds the entry point's model and runs one training iteration.

    python bench/baselines/bare_iteration.py ENTRY [--device cpu|cuda]

What a user would pay to run one step of their own script, without any profiler.
"""

import argparse
import importlib.util
import sys
import time
from pathlib import Path


def load(entry: Path):
    sys.path.insert(0, str(entry.parent))
    spec = importlib.util.spec_from_file_location("bench_entry", entry)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build_from_arguments():
    """Parse `ENTRY [--device]`, build the model, iteration and inputs on that device (as the
    engine does); returns (torch, device, iteration, inputs). torch is imported here, so its
    import counts in each baseline's time."""
    parser = argparse.ArgumentParser()
    parser.add_argument("entry", type=Path)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    import torch

    module = load(args.entry.resolve())
    with torch.device(args.device):
        model = module.skyline_model_provider()
        iteration = module.skyline_iteration_provider(model)
        inputs = module.skyline_input_provider()
    return torch, args.device, iteration, inputs


def main() -> None:
    torch, device, iteration, inputs = build_from_arguments()
    start = time.perf_counter()
    iteration(*inputs)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    print(f"one iteration: {(time.perf_counter() - start) * 1000:.1f} ms")


if __name__ == "__main__":
    main()
