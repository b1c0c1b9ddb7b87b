"""The benchmark's loop whose calls differ: the CNN example trained on every call and evaluated on
a fixed validation set every tenth call, as a training loop copied into the iteration does. The
analysis measures it in whole cycles of ten calls (measure/work_per_call.py)."""

import sys
from pathlib import Path

import torch

# The same model code as examples/cnn.
sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "examples" / "cnn"))
from model import SmallCNN

EVALUATE_EVERY = 10
VALIDATION_IMAGES = 256


def skyline_model_provider():
    return SmallCNN()


def skyline_input_provider(batch_size=32):
    images = torch.randn(batch_size, 3, 32, 32)
    labels = torch.randint(0, 10, (batch_size,))
    return (images, labels)


def skyline_iteration_provider(model):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    validation = (torch.randn(VALIDATION_IMAGES, 3, 32, 32), torch.randint(0, 10, (VALIDATION_IMAGES,)))
    calls = [0]

    def iteration(images, labels):
        calls[0] += 1
        optimizer.zero_grad()
        loss = model(images, labels)
        loss.backward()
        optimizer.step()
        if calls[0] % EVALUATE_EVERY == 0:
            model.eval()
            with torch.no_grad():
                model(*validation)
            model.train()

    return iteration
