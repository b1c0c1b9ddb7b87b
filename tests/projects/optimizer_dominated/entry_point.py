import torch
import torch.nn as nn


class WideMLP(nn.Module):
    """Weights, gradients and Adam's state dominate: the peak is in optimizer.step() at small batch
    sizes and in the backward pass at large ones."""

    def __init__(self, width=768, depth=3):
        super().__init__()
        layers = [nn.Linear(64, width), nn.ReLU()]
        for _ in range(depth - 1):
            layers += [nn.Linear(width, width), nn.ReLU()]
        self.body = nn.Sequential(*layers)
        self.head = nn.Linear(width, 10)

    def forward(self, x, y):
        return nn.functional.cross_entropy(self.head(self.body(x)), y)


def skyline_model_provider():
    return WideMLP()


def skyline_input_provider(batch_size=32):
    return (torch.randn(batch_size, 64), torch.randint(0, 10, (batch_size,)))


def skyline_iteration_provider(model):
    optimizer = torch.optim.Adam(model.parameters())

    def iteration(x, y):
        optimizer.zero_grad()
        model(x, y).backward()
        optimizer.step()

    return iteration
