"""fp16 autocast with a GradScaler that starts high (2^40): the float16 gradients overflow, so the
scaler skips optimizer.step(), halving its scale each time, for about 20 iterations: until then
there is no optimizer step and no Adam state to measure."""

import torch

from model import MLP


def skyline_model_provider():
    return MLP()


def skyline_input_provider(batch_size=32):
    return (torch.randn(batch_size, 64), torch.randint(0, 10, (batch_size,)))


def skyline_iteration_provider(model):
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**40)

    def iteration(x, labels):
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.float16):
            loss = model(x, labels)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()

    return iteration
