"""Data-parallel training that keeps each iteration's loss, and through retain_graph=True its
graph and saved activations (tests/test_distributed.py)."""

import torch

from model import WideMLP

losses = []


def skyline_model_provider():
    return WideMLP()


def skyline_input_provider(batch_size=16):
    return (torch.randn(batch_size, 64), torch.randint(0, 10, (batch_size,)))


def skyline_iteration_provider(model):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    def iteration(x, labels):
        optimizer.zero_grad()
        loss = model(x, labels)
        loss.backward(retain_graph=True)
        optimizer.step()
        losses.append(loss)

    return iteration
