"""The update's work outside optimizer.step(): gradients clipped before the step and zeroed in
place after it, the clipped norm read for a log. Then the model evaluated without gradients, which
reads the parameters the step wrote: forward work."""

import torch

from model import MLP


def skyline_model_provider():
    return MLP()


def skyline_input_provider(batch_size=32):
    return (torch.randn(batch_size, 64), torch.randint(0, 10, (batch_size,)))


def skyline_iteration_provider(model):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def iteration(x, labels):
        model(x, labels).backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=0.5, foreach=False)
        optimizer.step()
        optimizer.zero_grad(set_to_none=False)
        with torch.no_grad():
            model(x, labels)
        return float(norm)

    return iteration
