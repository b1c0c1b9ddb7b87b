"""Baseline (b): what a user does without Skyline. A cold process that warms the iteration up,
profiles one iteration with torch.profiler (stacks and memory) and prints its per-operation
table grouped by stack.

    python bench/baselines/torch_profiler_table.py ENTRY [--device cpu|cuda]
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from bare_iteration import build_from_arguments

WARMUP = 3


def main() -> None:
    torch, device, iteration, inputs = build_from_arguments()
    from torch.profiler import ProfilerActivity, profile

    for _ in range(WARMUP):
        iteration(*inputs)
    cuda = device.startswith("cuda")
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities, with_stack=True, profile_memory=True, record_shapes=True) as prof:
        iteration(*inputs)
        if cuda:
            torch.cuda.synchronize()
    sort = "self_cuda_time_total" if cuda else "self_cpu_time_total"
    print(prof.key_averages(group_by_stack_n=5).table(sort_by=sort, row_limit=30))


if __name__ == "__main__":
    main()
