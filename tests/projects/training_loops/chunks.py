"""A batch split into chunks of 16 samples, each run forward and backward, then one optimizer step:
the model runs batch_size / 16 times a call, more at larger batch sizes, and an optimizer step
takes batch_size samples (not gradient accumulation over micro-batches of batch_size each)."""

import torch

from model import MLP

CHUNK = 16


def skyline_model_provider():
    return MLP()


def skyline_input_provider(batch_size=64):
    return (torch.randn(batch_size, 64), torch.randint(0, 10, (batch_size,)))


def skyline_iteration_provider(model):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    def iteration(x, labels):
        optimizer.zero_grad()
        for chunk, chunk_labels in zip(x.split(CHUNK), labels.split(CHUNK)):
            model(chunk, chunk_labels).backward()
        optimizer.step()

    return iteration
