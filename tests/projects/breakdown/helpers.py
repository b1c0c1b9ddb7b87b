import torch


def scaled_tanh(x):
    return torch.tanh(x) * 2.0  # HELPER


class Square(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x  # FUNCTION_FORWARD

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return 2 * x * grad
