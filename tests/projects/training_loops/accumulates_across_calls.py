"""Gradient accumulation across calls: each call runs one micro-batch, and every fourth call steps
the optimizer. Calls differ: three of four make no step."""

import torch

from model import MLP

ACCUMULATED_CALLS = 4


def skyline_model_provider():
    return MLP()


def skyline_input_provider(batch_size=32):
    return (torch.randn(batch_size, 64), torch.randint(0, 10, (batch_size,)))


def skyline_iteration_provider(model):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    calls = [0]

    def iteration(x, labels):
        calls[0] += 1
        (model(x, labels) / ACCUMULATED_CALLS).backward()
        if calls[0] % ACCUMULATED_CALLS == 0:
            optimizer.step()  # STEP
            optimizer.zero_grad()

    return iteration
