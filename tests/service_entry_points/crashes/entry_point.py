"""The training iteration reads address 0: a segmentation fault."""

import ctypes

import torch
import torch.nn as nn


class TinyModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(8, 4)

    def forward(self, x):
        return self.linear(x).pow(2).mean()


def skyline_input_provider(batch_size=16):
    return (torch.randn(batch_size, 8),)


def skyline_model_provider():
    return TinyModel()


def skyline_iteration_provider(model):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    def iteration(x):
        optimizer.zero_grad()
        model(x).backward()
        optimizer.step()
        ctypes.string_at(0)  # <- HERE

    return iteration
