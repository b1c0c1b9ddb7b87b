"""An iteration left under autograd's anomaly detection, from chasing a NaN: every operation keeps
a stack trace, every gradient is checked."""

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
        with torch.autograd.detect_anomaly():  # ANOMALY
            loss = model(x, labels)
            loss.backward()
        optimizer.step()

    return iteration
