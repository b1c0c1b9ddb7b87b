"""A model whose lines are also annotated for torch.profiler, so the two can be compared."""

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.profiler import record_function


class Annotated(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(512, 1024)
        self.b = nn.Linear(1024, 1024)
        self.c = nn.Linear(1024, 1000)

    def forward(self, x, y):
        with record_function("LINE_A"):
            h = self.a(x).relu()  # LINE_A
        with record_function("LINE_B"):
            h = self.b(h).relu()  # LINE_B
        with record_function("LINE_C"):
            return F.cross_entropy(self.c(h), y)  # LINE_C


def skyline_model_provider():
    return Annotated()


def skyline_input_provider(batch_size=128):
    return (torch.randn(batch_size, 512), torch.randint(0, 1000, (batch_size,)))


def skyline_iteration_provider(model):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    def iteration(x, y):
        optimizer.zero_grad()
        model(x, y).backward()
        optimizer.step()

    return iteration
