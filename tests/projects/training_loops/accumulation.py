"""Gradient accumulation: four micro-batches of `batch_size` samples, then one step of a fused Adam
with a learning-rate scheduler."""

import torch

from model import MLP

MICRO_BATCHES = 4


def skyline_model_provider():
    return MLP()


def skyline_input_provider(batch_size=32):
    return (torch.randn(MICRO_BATCHES, batch_size, 64), torch.randint(0, 10, (MICRO_BATCHES, batch_size)))


def skyline_iteration_provider(model):
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, fused=True)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=10)

    def iteration(xs, labels):
        optimizer.zero_grad()
        for x, y in zip(xs, labels):
            loss = model(x, y) / MICRO_BATCHES
            loss.backward()
        optimizer.step()
        scheduler.step()

    return iteration
