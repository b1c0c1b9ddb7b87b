"""A data-parallel training script as users write them for torchrun: it sets up its own process
group from the launcher's environment, wraps its model in DistributedDataParallel, shards the data
with a DistributedSampler, and saves a checkpoint on rank 0 after the loop (never reached)."""

import argparse

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

from model import Classifier


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch-size", type=int, default=32)  # BATCH
    parser.add_argument("--epochs", type=int, default=1000)
    parser.add_argument("--checkpoint", default="checkpoint.pt")
    parser.add_argument("--fail-on-rank", type=int, default=-1)
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    data = TensorDataset(torch.randn(4096, 64), torch.randint(0, 10, (4096,)))
    sampler = DistributedSampler(data)
    loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler)
    model = DistributedDataParallel(Classifier())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for step, (x, y) in enumerate(loader):
            if rank == args.fail_on_rank and step == 3:
                raise ValueError(f"rank {rank} cannot go on")  # FAILS
            loss = F.cross_entropy(model(x), y)  # MODEL
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()  # STEP
    if rank == 0:
        torch.save(model.module.state_dict(), args.checkpoint)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
