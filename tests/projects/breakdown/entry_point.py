import torch

from model import Net


def skyline_model_provider():
    return Net()


def skyline_input_provider(batch_size=64):
    return (torch.randn(batch_size, 32), torch.randint(0, 10, (batch_size,)))


def skyline_iteration_provider(model):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)  # OPTIMIZER

    def iteration(x, y):
        optimizer.zero_grad()
        loss = model(x, y)  # MODEL_CALL
        loss.backward()  # BACKWARD_CALL
        optimizer.step()  # STEP

    return iteration
