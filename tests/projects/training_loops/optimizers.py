"""Two optimizers, one with two parameter groups, stepping in one iteration: SGD with momentum
(foreach) for the body, Adam (for-loop) for the head; gradients zeroed in place, not freed."""

import torch

from model import MLP


def skyline_model_provider():
    return MLP()


def skyline_input_provider(batch_size=32):
    return (torch.randn(batch_size, 64), torch.randint(0, 10, (batch_size,)))


def skyline_iteration_provider(model):
    first, second = model.body[0], model.body[2]
    body = torch.optim.SGD(
        [{"params": first.parameters()}, {"params": second.parameters(), "lr": 0.01}],
        lr=0.1,
        momentum=0.9,
        foreach=True,
    )
    head = torch.optim.Adam(model.head.parameters(), lr=1e-3, foreach=False)

    def iteration(x, labels):
        body.zero_grad(set_to_none=False)
        head.zero_grad(set_to_none=False)
        loss = model(x, labels)
        loss.backward()
        body.step()
        head.step()

    return iteration
