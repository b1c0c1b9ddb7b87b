import torch.nn as nn


class MLP(nn.Module):
    def __init__(self, features=64, hidden=256, classes=10):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(features, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU())
        self.head = nn.Linear(hidden, classes)
        self.loss = nn.CrossEntropyLoss()

    def forward(self, x, labels):
        hidden = self.body(x)
        logits = self.head(hidden)
        return self.loss(logits, labels)
