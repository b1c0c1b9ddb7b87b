import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from helpers import Square, repeated_sigmoid, scaled_tanh


class Net(nn.Module):
    """Each line exercises one way of running operations that the breakdown must attribute."""

    def __init__(self, width=128, depth=3):
        super().__init__()
        self.inp = nn.Linear(32, width)  # INPUT_LAYER
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))  # LAYERS
        self.block = nn.Sequential(nn.Linear(width, width), nn.GELU())
        self.out = nn.Linear(width, 10)

    def forward(self, x, y):
        h = self.inp(x)  # INPUT_CALL
        for layer in self.layers:
            h = layer(h).relu_()  # LOOP
        h = checkpoint(self.block, h, use_reentrant=False)  # CHECKPOINT
        h = scaled_tanh(h)  # HELPER_CALL
        h = repeated_sigmoid(h, 3)  # RECURSION_CALL
        h = Square.apply(h)  # FUNCTION_CALL
        return F.cross_entropy(self.out(h), y)  # LOSS
