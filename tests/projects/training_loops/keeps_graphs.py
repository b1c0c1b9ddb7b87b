"""A classic leak: each iteration's loss kept in a list, and with it, through retain_graph=True,
its autograd graph and the activations it saved."""

import torch

from model import MLP

losses = []


def skyline_model_provider():
    return MLP()


def skyline_input_provider(batch_size=32):
    return (torch.randn(batch_size, 64), torch.randint(0, 10, (batch_size,)))


def skyline_iteration_provider(model):
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)

    def iteration(x, labels):
        optimizer.zero_grad()
        loss = model(x, labels)
        loss.backward(retain_graph=True)
        optimizer.step()
        losses.append(loss)

    return iteration
