"""The benchmark's compiled model: the transformer example, unchanged but for torch.compile."""

import sys
from pathlib import Path

import torch

# The same model code as examples/transformer.
sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "examples" / "transformer"))
from model import TinyLanguageModel

CONTEXT = 64
VOCABULARY = 1000


def skyline_model_provider():
    return torch.compile(TinyLanguageModel(vocabulary=VOCABULARY, context=CONTEXT))


def skyline_input_provider(batch_size=16):
    tokens = torch.randint(0, VOCABULARY, (batch_size, CONTEXT + 1))
    return (tokens[:, :-1], tokens[:, 1:])


def skyline_iteration_provider(model):
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)

    def iteration(tokens, targets):
        optimizer.zero_grad()
        loss = model(tokens, targets)
        loss.backward()
        optimizer.step()

    return iteration
