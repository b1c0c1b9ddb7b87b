"""Skyline entry point for a small CNN on 32x32 images."""

import torch

from model import SmallCNN


def skyline_model_provider():
    return SmallCNN()


def skyline_input_provider(batch_size=32):
    images = torch.randn(batch_size, 3, 32, 32)
    labels = torch.randint(0, 10, (batch_size,))
    return (images, labels)


def skyline_iteration_provider(model):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def iteration(images, labels):
        optimizer.zero_grad()
        loss = model(images, labels)
        loss.backward()
        optimizer.step()

    return iteration
