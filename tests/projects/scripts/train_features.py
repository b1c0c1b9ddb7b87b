"""A training script with what real ones have: gradient accumulation, autocast with a GradScaler, an
evaluation every 5 steps, a `while True` loop and a DataLoader with worker processes."""

import argparse

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from model import Classifier


def evaluate(model, batches):
    model.eval()
    with torch.no_grad():
        total = sum(F.cross_entropy(model(x), y).item() for x, y in batches)  # EVAL
    model.train()
    return total


def forever(loader):
    # Not itertools.cycle, which keeps every batch it yields: its memory grows through the first epoch.
    while True:
        yield from loader


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--accumulate", type=int, default=4)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    data = TensorDataset(torch.randn(4096, 64), torch.randint(0, 10, (4096,)))
    loader = DataLoader(data, batch_size=args.batch_size, shuffle=True, num_workers=args.workers)
    validation = [(torch.randn(256, 64), torch.randint(0, 10, (256,))) for _ in range(4)]
    model = Classifier()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu")
    batches = forever(loader)
    step = 0
    while True:
        for _ in range(args.accumulate):
            x, y = next(batches)  # LOAD
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = F.cross_entropy(model(x), y) / args.accumulate  # LOSS
            scaler.scale(loss).backward()
        scaler.step(optimizer)  # STEP
        scaler.update()
        optimizer.zero_grad()
        step += 1
        if step % 5 == 0:
            evaluate(model, validation)


if __name__ == "__main__":
    main()
