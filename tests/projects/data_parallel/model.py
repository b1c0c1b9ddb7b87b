"""An MLP with more than a MiB of weights: DDP puts its gradients in more than one bucket (the
first bucket holds at most 1 MiB)."""

from torch import nn


class WideMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = nn.Linear(64, 1024)
        self.middle = nn.Linear(1024, 512)
        self.head = nn.Linear(512, 10)
        self.loss = nn.CrossEntropyLoss()

    def forward(self, x, labels):
        hidden = self.inner(x).relu()
        hidden = self.middle(hidden).relu()
        return self.loss(self.head(hidden), labels)
