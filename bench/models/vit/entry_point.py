"""Skyline entry point for a small vision transformer (bench/fidelity.py): CIFAR-sized random
images, cross-entropy with label smoothing, AdamW (about 100-300 ms an iteration on two CPU
cores)."""

import torch
import torch.nn.functional as F

from model import VisionTransformer


def skyline_model_provider():
    return VisionTransformer(image_size=32, patch_size=4, num_classes=10, width=192, heads=3, depth=4)


def skyline_input_provider(batch_size=32):
    images = torch.randn(batch_size, 3, 32, 32)
    labels = torch.randint(0, 10, (batch_size,))
    return (images, labels)


def skyline_iteration_provider(model):
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)

    def iteration(images, labels):
        optimizer.zero_grad()
        logits = model(images)
        loss = F.cross_entropy(logits, labels, label_smoothing=0.1)
        loss.backward()
        optimizer.step()

    return iteration
