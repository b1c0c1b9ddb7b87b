"""Data-parallel training that evaluates the model on a fixed validation set every fifth call:
each rank's calls differ, alike on every rank (tests/test_distributed.py)."""

import torch

from model import WideMLP

EVALUATE_EVERY = 5
VALIDATION_SAMPLES = 512


def skyline_model_provider():
    return WideMLP()


def skyline_input_provider(batch_size=16):
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
