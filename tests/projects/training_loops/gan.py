"""A GAN's iteration: the discriminator learns from the generator's output detached, so the graph
that made it is never backwarded; then the generator learns through the discriminator."""

import torch
import torch.nn as nn
import torch.nn.functional as F


def skyline_model_provider():
    return nn.ModuleDict(
        {
            "generator": nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64)),
            "discriminator": nn.Sequential(nn.Linear(64, 64), nn.LeakyReLU(0.2), nn.Linear(64, 1)),
        }
    )


def skyline_input_provider(batch_size=32):
    return (torch.randn(batch_size, 64), torch.randn(batch_size, 16))


def skyline_iteration_provider(model):
    generator, discriminator = model["generator"], model["discriminator"]
    generator_optimizer = torch.optim.Adam(generator.parameters(), lr=1e-4)
    discriminator_optimizer = torch.optim.Adam(discriminator.parameters(), lr=1e-4)

    def iteration(real, noise):
        fake = generator(noise).detach()
        discriminator_loss = F.softplus(-discriminator(real)).mean() + F.softplus(discriminator(fake)).mean()
        discriminator_optimizer.zero_grad()
        discriminator_loss.backward()
        discriminator_optimizer.step()

        generator_loss = F.softplus(-discriminator(generator(noise))).mean()
        generator_optimizer.zero_grad()
        generator_loss.backward()
        generator_optimizer.step()

    return iteration
