"""A WGAN's loop: the critic steps on every call, the generator on every fifth. Calls differ, and
the generator's optimizer does not step in the first calls."""

import torch
import torch.nn as nn

CRITIC_STEPS = 5


def skyline_model_provider():
    return nn.ModuleDict(
        {
            "generator": nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64)),
            "critic": nn.Sequential(nn.Linear(64, 64), nn.LeakyReLU(0.2), nn.Linear(64, 1)),
        }
    )


def skyline_input_provider(batch_size=32):
    return (torch.randn(batch_size, 64), torch.randn(batch_size, 16))


def skyline_iteration_provider(model):
    generator, critic = model["generator"], model["critic"]
    generator_optimizer = torch.optim.RMSprop(generator.parameters(), lr=5e-5)
    critic_optimizer = torch.optim.RMSprop(critic.parameters(), lr=5e-5)
    calls = [0]

    def iteration(real, noise):
        calls[0] += 1
        critic_loss = critic(generator(noise).detach()).mean() - critic(real).mean()
        critic_optimizer.zero_grad()
        critic_loss.backward()
        critic_optimizer.step()
        if calls[0] % CRITIC_STEPS == 0:
            generator_loss = -critic(generator(noise)).mean()
            generator_optimizer.zero_grad()
            generator_loss.backward()
            generator_optimizer.step()

    return iteration
