"""The benchmark's accumulation to a fixed number of samples per optimizer step: the CNN example
trained on 128 samples a step, in 128 // batch_size micro-batches of batch_size images (4 at the
user's 32, as a script that derives its accumulation steps from the batch size does). Each batch
size runs its own number of micro-batches; the run-time line is one micro-batch's."""

import sys
from pathlib import Path

import torch

# The same model code as examples/cnn.
sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "examples" / "cnn"))
from model import SmallCNN

SAMPLES_PER_STEP = 128


def skyline_model_provider():
    return SmallCNN()


def skyline_input_provider(batch_size=32):
    micro_batches = SAMPLES_PER_STEP // batch_size
    images = torch.randn(micro_batches, batch_size, 3, 32, 32)
    labels = torch.randint(0, 10, (micro_batches, batch_size))
    return (images, labels)


def skyline_iteration_provider(model):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def iteration(images, labels):
        optimizer.zero_grad()
        for micro_images, micro_labels in zip(images, labels):
            loss = model(micro_images, micro_labels) / len(images)
            loss.backward()
        optimizer.step()

    return iteration
