"""Rank 1 is killed in its iteration (as the kernel kills a process out of memory)."""

import os
import signal

import torch

from model import WideMLP


def skyline_model_provider():
    return WideMLP()


def skyline_input_provider(batch_size=16):
    return (torch.randn(batch_size, 64), torch.randint(0, 10, (batch_size,)))


def skyline_iteration_provider(model):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    def iteration(x, labels):
        if os.environ["RANK"] == "1":
            os.kill(os.getpid(), signal.SIGKILL)
        loss = model(x, labels)
        loss.backward()
        optimizer.step()

    return iteration
