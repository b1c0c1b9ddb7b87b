"""Baseline (b): what a user does without Skyline. A cold process that warms the iteration up,
profiles one iteration with torch.profiler (stacks and memory) and prints its per-operation
table grouped by stack.

    python bench/baselines/torch_profiler_table.py ENTRY [--device cpu|cuda]
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from bare_iteration import load  # noqa: E402

WARMUP = 3


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("entry", type=Path)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    import torch
    from torch.profiler import ProfilerActivity, profile

    module = load(args.entry.resolve())
    with torch.device(args.device):
        model = module.skyline_model_provider()
        iteration = module.skyline_iteration_provider(model)
        inputs = module.skyline_input_provider()
    for _ in range(WARMUP):
        iteration(*inputs)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if args.device.startswith("cuda") else [])
    with profile(activities=activities, with_stack=True, profile_memory=True, record_shapes=True) as prof:
        iteration(*inputs)
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
    sort = "self_cuda_time_total" if args.device.startswith("cuda") else "self_cpu_time_total"
    print(prof.key_averages(group_by_stack_n=5).table(sort_by=sort, row_limit=30))


if __name__ == "__main__":
    main()
