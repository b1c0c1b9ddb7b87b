"""The model provider allocates tensors until allocation fails (the tests bound the worker's memory)."""

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
    hoard = []
    while True:
        hoard.append(torch.empty(16 * 2**20))  # 64 MiB each, never touched  # <- HERE


def skyline_iteration_provider(model):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    def iteration(x):
        optimizer.zero_grad()
        model(x).backward()
        optimizer.step()

    return iteration
