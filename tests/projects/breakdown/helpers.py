import torch


def scaled_tanh(x):
    return torch.tanh(x) * 2.0  # HELPER


def repeated_sigmoid(x, times):
    """Calls itself: its line is in the stack of its own operations more than once."""
    if times == 0:
        return x
    return repeated_sigmoid(torch.sigmoid(x), times - 1)  # RECURSION


class Square(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x  # FUNCTION_FORWARD

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return 2 * x * grad
