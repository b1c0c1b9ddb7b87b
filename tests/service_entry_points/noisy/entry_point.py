"""The model provider writes 16 MiB to stderr without a newline, then 8 lines of 1 MiB, then ends
the process with os._exit(1): what the service keeps of it must stay small."""

import os
import sys

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
    chunk = "x" * (1 << 20)
    for _ in range(16):
        sys.stderr.write(chunk)
    for _ in range(8):
        sys.stderr.write(chunk + "\n")
    sys.stderr.write("the last words\n")
    sys.stderr.flush()
    os._exit(1)


def skyline_iteration_provider(model):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    def iteration(x):
        optimizer.zero_grad()
        model(x).backward()
        optimizer.step()

    return iteration
