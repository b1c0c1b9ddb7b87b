"""A model with a head that only an evaluation uses: in training its parameters get no gradient,
which DistributedDataParallel, as Skyline wraps the model, refuses from the second iteration on."""

import torch
from torch import nn

from model import WideMLP


class WithAuxiliaryHead(WideMLP):
    def __init__(self):
        super().__init__()
        self.auxiliary = nn.Linear(512, 2)  # evaluation only


def skyline_model_provider():
    return WithAuxiliaryHead()


def skyline_input_provider(batch_size=16):
    return (torch.randn(batch_size, 64), torch.randint(0, 10, (batch_size,)))


def skyline_iteration_provider(model):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    def iteration(x, labels):
        optimizer.zero_grad()
        model(x, labels).backward()  # FAILS
        optimizer.step()

    return iteration
