import torch.nn as nn


class MLPClassifier(nn.Module):
    """A small classifier that returns its loss, as Skyline's entry points expect."""

    def __init__(self, features=256, hidden=512, classes=10):
        super().__init__()
        self.body = nn.Sequential(
            nn.Linear(features, hidden),
            nn.ReLU(),
            nn.Linear(hidden, hidden),
            nn.ReLU(),
        )
        self.head = nn.Linear(hidden, classes)
        self.loss = nn.CrossEntropyLoss()

    def forward(self, features, labels):
        hidden = self.body(features)
        logits = self.head(hidden)
        return self.loss(logits, labels)
