"""The training iteration never returns."""

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


def spin():
    turns = 0
    while True:
        turns += 1  # the body; the jump back is on the `while` line  # <- HERE


def skyline_iteration_provider(model):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    def iteration(x):
        optimizer.zero_grad()
        model(x).backward()
        optimizer.step()
        spin()

    return iteration
