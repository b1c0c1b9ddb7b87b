"""A functional training step with torch.func: the gradient of a functional_call, the parameters
updated by hand. torch.func's transforms refuse autograd's saved-tensor hooks."""

import torch
from torch.func import functional_call, grad

from model import MLP


def skyline_model_provider():
    return MLP()


def skyline_input_provider(batch_size=32):
    return (torch.randn(batch_size, 64), torch.randint(0, 10, (batch_size,)))


def skyline_iteration_provider(model):
    params = {name: p.detach() for name, p in model.named_parameters()}

    def loss(params, x, labels):
        return functional_call(model, params, (x, labels))

    gradients = grad(loss)

    def iteration(x, labels):
        found = gradients(params, x, labels)
        for name, p in params.items():
            p -= 0.01 * found[name]  # noqa: PLW2901 (in place, as such loops are written)

    return iteration
