"""A training step on every call, and on every fifth call an evaluation of the model on a fixed
validation set, larger than the batch: calls differ in their passes through the model, not in
their optimizer steps."""

import torch

from model import MLP

EVALUATE_EVERY = 5
VALIDATION_SAMPLES = 1024


def skyline_model_provider():
    return MLP()


def skyline_input_provider(batch_size=32):
    return (torch.randn(batch_size, 64), torch.randint(0, 10, (batch_size,)))


def skyline_iteration_provider(model):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    validation = (torch.randn(VALIDATION_SAMPLES, 64), torch.randint(0, 10, (VALIDATION_SAMPLES,)))
    calls = [0]

    def iteration(x, labels):
        calls[0] += 1
        optimizer.zero_grad()
        model(x, labels).backward()
        optimizer.step()
        if calls[0] % EVALUATE_EVERY == 0:
            with torch.no_grad():
                model(*validation)  # EVALUATE

    return iteration
