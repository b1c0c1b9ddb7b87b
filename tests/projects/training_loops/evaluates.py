"""One training step, then the same model evaluated on the batch without gradients: two calls of
the model, one backward pass, one step. No gradient accumulation: one micro-batch."""

import torch

from model import MLP


def skyline_model_provider():
    return MLP()


def skyline_input_provider(batch_size=32):
    return (torch.randn(batch_size, 64), torch.randint(0, 10, (batch_size,)))


def skyline_iteration_provider(model):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    def iteration(x, labels):
        optimizer.zero_grad()
        model(x, labels).backward()
        optimizer.step()
        with torch.no_grad():
            model(x, labels)

    return iteration
