"""A model whose activations can be counted by hand: exp's output is saved for backward by exp
itself and twice by the product that squares it, one tensor of batch_size × 256 floats."""

import torch
import torch.nn as nn

FEATURES = 256


class Saves(nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(()))

    def forward(self, x):
        y = torch.exp(x * self.scale)  # EXP
        return (y * y).sum()  # SQUARE


def skyline_model_provider():
    return Saves()


def skyline_input_provider(batch_size=64):
    return (torch.randn(batch_size, FEATURES),)


def skyline_iteration_provider(model):
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-6)

    def iteration(x):
        optimizer.zero_grad()
        model(x).backward()
        optimizer.step()

    return iteration
