"""A batch split into four chunks, whatever its size, each run forward and backward, then one
optimizer step: an optimizer step takes batch_size samples, in micro-batches of batch_size / 4 (as
many calls at every batch size, as with gradient accumulation, but each of a quarter batch)."""

import torch

from model import MLP

CHUNKS = 4


def skyline_model_provider():
    return MLP()


def skyline_input_provider(batch_size=64):
    return (torch.randn(batch_size, 64), torch.randint(0, 10, (batch_size,)))


def skyline_iteration_provider(model):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    def iteration(x, labels):
        optimizer.zero_grad()
        for chunk, chunk_labels in zip(x.chunk(CHUNKS), labels.chunk(CHUNKS)):
            (model(chunk, chunk_labels) / CHUNKS).backward()
        optimizer.step()

    return iteration
