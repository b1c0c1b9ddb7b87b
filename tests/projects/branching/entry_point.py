"""A model whose operations depend on the batch size (a branch taken from 48 samples on): the
memory profiles of the measured batch sizes do not line up operation by operation, so the engine
falls back to a line per phase and measures memory alone at larger batch sizes."""

import torch
import torch.nn as nn


class Branching(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(32, 32)

    def forward(self, x):
        h = self.fc(x)
        if x.shape[0] >= 48:  # BRANCH
            h = h * 0.5
        return h.square().mean()


def skyline_model_provider():
    return Branching()


def skyline_input_provider(batch_size=32):
    return (torch.randn(batch_size, 32),)


def skyline_iteration_provider(model):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    def iteration(x):
        optimizer.zero_grad()
        model(x).backward()
        optimizer.step()

    return iteration
