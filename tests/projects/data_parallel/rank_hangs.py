"""Rank 1 never finishes its iteration; rank 0 then waits for it in a collective."""

import os
import time

import torch

from model import WideMLP


def skyline_model_provider():
    return WideMLP()


def skyline_input_provider(batch_size=16):
    return (torch.randn(batch_size, 64), torch.randint(0, 10, (batch_size,)))


def skyline_iteration_provider(model):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    def iteration(x, labels):
        while os.environ["RANK"] == "1":
            time.sleep(0.05)
        loss = model(x, labels)
        loss.backward()
        optimizer.step()

    return iteration
