"""Two averaged copies of the model, updated after each step: torch's AveragedModel (an EMA,
torch._foreach_lerp_ on its parameters) and a deep copy updated by hand; held by a trainer whose
method is the iteration. Then the averaged model evaluated without gradients: forward work."""

import copy

import torch
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

from model import MLP


def skyline_model_provider():
    return MLP()


def skyline_input_provider(batch_size=32):
    return (torch.randn(batch_size, 64), torch.randint(0, 10, (batch_size,)))


class Trainer:
    def __init__(self, model):
        self.model = model
        self.optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        self.ema = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(0.999))  # AVERAGED
        self.shadow = copy.deepcopy(model).requires_grad_(False)  # SHADOW

    def step(self, x, labels):
        self.optimizer.zero_grad()
        self.model(x, labels).backward()
        self.optimizer.step()
        self.ema.update_parameters(self.model)  # EMA_UPDATE
        with torch.no_grad():
            for averaged, trained in zip(self.shadow.parameters(), self.model.parameters()):
                averaged.mul_(0.99).add_(trained, alpha=0.01)  # SHADOW_UPDATE
            self.ema(x, labels)  # EMA_EVAL


def skyline_iteration_provider(model):
    return Trainer(model).step
