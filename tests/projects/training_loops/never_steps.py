"""As mixed_precision.py, but the scale is infinite: every step overflows, and the optimizer never steps."""

import torch

from model import MLP


def skyline_model_provider():
    return MLP()


def skyline_input_provider(batch_size=32):
    return (torch.randn(batch_size, 64), torch.randint(0, 10, (batch_size,)))


def skyline_iteration_provider(model):
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu", init_scale=float("inf"))

    def iteration(x, labels):
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.float16):
            loss = model(x, labels)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()

    return iteration
