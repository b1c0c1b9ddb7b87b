"""The benchmark's optimizer-dominated model: Adam over a wide MLP. Weights, gradients and Adam's
two moments (about 60 MiB) outweigh the activations at small batch sizes, so the peak sits in
optimizer.step() there, and in the backward pass from about a thousand samples on."""

import torch
import torch.nn as nn


class WideMLP(nn.Module):
    def __init__(self, width=1024, depth=4):
        super().__init__()
        layers = [nn.Linear(256, width), nn.ReLU()]
        for _ in range(depth - 1):
            layers += [nn.Linear(width, width), nn.ReLU()]
        self.body = nn.Sequential(*layers)
        self.head = nn.Linear(width, 10)

    def forward(self, x, y):
        return nn.functional.cross_entropy(self.head(self.body(x)), y)


def skyline_model_provider():
    return WideMLP()


def skyline_input_provider(batch_size=32):
    return (torch.randn(batch_size, 256), torch.randint(0, 10, (batch_size,)))


def skyline_iteration_provider(model):
    optimizer = torch.optim.Adam(model.parameters())

    def iteration(x, y):
        optimizer.zero_grad()
        model(x, y).backward()
        optimizer.step()

    return iteration
