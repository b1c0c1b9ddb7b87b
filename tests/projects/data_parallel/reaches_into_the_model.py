"""The iteration calls a part of the model (`model.inner`), which DistributedDataParallel, wrapping
the model in data-parallel analysis, does not have."""

import torch

from model import WideMLP


def skyline_model_provider():
    return WideMLP()


def skyline_input_provider(batch_size=16):
    return (torch.randn(batch_size, 64), torch.randint(0, 10, (batch_size,)))


def skyline_iteration_provider(model):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    def iteration(x, labels):
        features = model.inner(x)
        features.pow(2).mean().backward()
        optimizer.step()

    return iteration
