"""A training script as users write them: argparse, a DataLoader, AdamW, a cosine schedule, a log
line every 100 steps and a checkpoint saved after the loop (which Skyline never reaches)."""

import argparse
import time

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from model import Classifier


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch-size", type=int, default=64)  # BATCH
    parser.add_argument("--epochs", type=int, default=1000)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--checkpoint", default="checkpoint.pt")
    parser.add_argument("--fail-at-step", type=int, default=0)
    parser.add_argument("--samples", type=int, default=4096)
    args = parser.parse_args()

    data = TensorDataset(torch.randn(args.samples, 64), torch.randint(0, 10, (args.samples,)))
    loader = DataLoader(data, batch_size=args.batch_size, shuffle=True)
    model = Classifier()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.epochs * len(loader))

    step = 0
    start = time.perf_counter()
    for _epoch in range(args.epochs):
        for x, y in loader:
            logits = model(x)  # MODEL
            loss = F.cross_entropy(logits, y)  # LOSS
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()  # STEP
            scheduler.step()
            step += 1
            if step == args.fail_at_step:
                raise ValueError(f"step {step} went wrong")  # FAILS
            if step % 100 == 0:
                elapsed = time.perf_counter() - start
                print(f"step {step} loss {loss.item():.3f} {elapsed / 100 * 1000:.2f} ms/step")
                start = time.perf_counter()
    torch.save(model.state_dict(), args.checkpoint)


if __name__ == "__main__":
    main()
