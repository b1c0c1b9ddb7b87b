"""LBFGS: each step evaluates its closure (the model, a backward pass) up to max_iter times on the
same batch, and keeps the updates of its last history_size inner iterations, two flat vectors of
all the parameters each, so its state grows for its first steps (about max_iter entries each)."""

import torch

from model import MLP

HISTORY_SIZE = 20


def skyline_model_provider():
    return MLP()


def skyline_input_provider(batch_size=32):
    return (torch.randn(batch_size, 64), torch.randint(0, 10, (batch_size,)))


def skyline_iteration_provider(model):
    # No tolerance ends a step early: every step runs all max_iter evaluations.
    optimizer = torch.optim.LBFGS(  # LBFGS
        model.parameters(), lr=0.1, max_iter=2, history_size=HISTORY_SIZE, tolerance_grad=0, tolerance_change=0
    )

    def iteration(x, labels):
        # A new batch each call, as training reads: on the same one LBFGS converges, and without
        # tolerances its next steps divide by nothing (NaN, once in several analyses).
        x = x + torch.randn_like(x)

        def closure():
            optimizer.zero_grad()
            loss = model(x, labels)
            loss.backward()
            return loss

        optimizer.step(closure)

    return iteration
