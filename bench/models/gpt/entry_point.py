"""Skyline entry point for a small GPT (bench/fidelity.py): next-token prediction on random
tokens, AdamW with weight decay on the matrices, gradient clipping (about 100-300 ms an
iteration on two CPU cores)."""

import torch

from model import GPT

VOCABULARY = 4096
CONTEXT = 128


def skyline_model_provider():
    return GPT(vocabulary=VOCABULARY, context=CONTEXT, width=128, heads=4, layers=4)


def skyline_input_provider(batch_size=16):
    data = torch.randint(0, VOCABULARY, (batch_size, CONTEXT + 1))
    x = data[:, :-1].contiguous()
    y = data[:, 1:].contiguous()
    return (x, y)


def skyline_iteration_provider(model):
    optimizer = model.configure_optimizers(weight_decay=0.1, learning_rate=6e-4, betas=(0.9, 0.95))

    def iteration(x, y):
        _, loss = model(x, y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()

    return iteration
