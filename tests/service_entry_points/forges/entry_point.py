"""The model provider writes the bytes of `message.msgpack` (next to this file) to the worker's
message channel, as any code in the worker can: a forged or malformed message. Then it sleeps."""

import os
import time
from pathlib import Path

import torch
import torch.nn as nn


class TinyModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(8, 4)

    def forward(self, x):
        return self.linear(x).pow(2).mean()


def _channel_fd():
    """The worker's message channel: the one pipe it holds that is neither its stdin nor stderr."""
    links = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            links[int(name)] = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue
    known = {links.get(0), links.get(2)}
    return next(fd for fd, link in sorted(links.items()) if link.startswith("pipe:") and link not in known)


def skyline_input_provider(batch_size=16):
    return (torch.randn(batch_size, 8),)


def skyline_model_provider():
    os.write(_channel_fd(), (Path(__file__).parent / "message.msgpack").read_bytes())
    time.sleep(600)
    return TinyModel()


def skyline_iteration_provider(model):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    def iteration(x):
        optimizer.zero_grad()
        model(x).backward()
        optimizer.step()

    return iteration
