"""A contrastive (CLIP-style) loss in miniature: every sample is compared with every other, so
the logits are batch × batch and memory grows with the batch size squared."""

import torch
import torch.nn as nn
import torch.nn.functional as F


class Contrastive(nn.Module):
    def __init__(self):
        super().__init__()
        self.images = nn.Linear(48, 32)
        self.texts = nn.Linear(24, 32)

    def forward(self, images, texts):
        a = F.normalize(self.images(images), dim=-1)
        b = F.normalize(self.texts(texts), dim=-1)
        logits = a @ b.t() * 10.0
        target = torch.arange(len(images))
        return (F.cross_entropy(logits, target) + F.cross_entropy(logits.t(), target)) / 2


def skyline_model_provider():
    return Contrastive()


def skyline_input_provider(batch_size=64):
    return torch.randn(batch_size, 48), torch.randn(batch_size, 24)


def skyline_iteration_provider(model):
    optimizer = torch.optim.Adam(model.parameters())

    def iteration(images, texts):
        optimizer.zero_grad()
        model(images, texts).backward()
        optimizer.step()

    return iteration
