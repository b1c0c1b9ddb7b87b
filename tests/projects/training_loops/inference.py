"""Inference only: the model evaluated under inference_mode, no backward pass, no optimizer."""

import torch

from model import MLP


def skyline_model_provider():
    return MLP().eval()


def skyline_input_provider(batch_size=32):
    return (torch.randn(batch_size, 64), torch.randint(0, 10, (batch_size,)))


def skyline_iteration_provider(model):
    @torch.inference_mode()
    def iteration(x, labels):
        model(x, labels)

    return iteration
