"""Sharpness-aware minimization: forward and backward on the batch, the weights moved up the
gradient in place, forward and backward on the same batch again, the weights moved back and the
base optimizer stepped. One batch of batch_size samples a step, evaluated twice: no micro-batches."""

import torch

from model import MLP

RHO = 0.05


def skyline_model_provider():
    return MLP()


def skyline_input_provider(batch_size=32):
    return (torch.randn(batch_size, 64), torch.randint(0, 10, (batch_size,)))


def skyline_iteration_provider(model):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    parameters = list(model.parameters())

    def iteration(x, labels):
        model(x, labels).backward()
        with torch.no_grad():
            norm = torch.norm(torch.stack([p.grad.norm() for p in parameters]))
            moves = [p.grad * (RHO / (norm + 1e-12)) for p in parameters]
            for p, move in zip(parameters, moves):
                p.add_(move)  # ASCEND
        optimizer.zero_grad()
        model(x, labels).backward()
        with torch.no_grad():
            for p, move in zip(parameters, moves):
                p.sub_(move)
        optimizer.step()
        optimizer.zero_grad()

    return iteration
