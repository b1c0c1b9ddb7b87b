"""gan.py's generator and discriminator in a WGAN's loop: the discriminator (the critic) steps on
every call, the generator on every fifth. Calls differ, and the generator's optimizer does not step
in the first calls."""

import torch
from gan import skyline_input_provider, skyline_model_provider  # noqa: F401 - the providers Skyline calls

CRITIC_STEPS = 5


def skyline_iteration_provider(model):
    generator, critic = model["generator"], model["discriminator"]
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
            generator_loss = -critic(generator(noise)).mean()  # GENERATOR_LOSS
            generator_optimizer.zero_grad()
            generator_loss.backward()
            generator_optimizer.step()  # GENERATOR_STEP

    return iteration
