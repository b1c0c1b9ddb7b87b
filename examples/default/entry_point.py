"""Skyline entry point for a small MLP classifier (the default example: seconds on a laptop CPU)."""

import torch

from model import MLPClassifier


def skyline_model_provider():
    return MLPClassifier()


def skyline_input_provider(batch_size=128):
    features = torch.randn(batch_size, 256)
    labels = torch.randint(0, 10, (batch_size,))
    return (features, labels)


def skyline_iteration_provider(model):
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)

    def iteration(features, labels):
        optimizer.zero_grad()
        loss = model(features, labels)
        loss.backward()
        optimizer.step()

    return iteration
