"""Gradient accumulation to a fixed number of samples per optimizer step: the input provider makes
128 // batch_size micro-batches of batch_size samples (16 at 8 samples, 8 at 16, 4 at 32), each run
forward and backward, then one step."""

import torch

from model import MLP

SAMPLES_PER_STEP = 128


def skyline_model_provider():
    return MLP()


def skyline_input_provider(batch_size=16):
    micro_batches = SAMPLES_PER_STEP // batch_size
    return (torch.randn(micro_batches, batch_size, 64), torch.randint(0, 10, (micro_batches, batch_size)))


def skyline_iteration_provider(model):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    def iteration(xs, labels):
        optimizer.zero_grad()
        for x, y in zip(xs, labels):
            (model(x, y) / len(xs)).backward()
        optimizer.step()

    return iteration
