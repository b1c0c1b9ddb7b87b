"""A LightningModule trained by Lightning's Trainer.fit, as its documentation shows: the model's
forward, training_step and configure_optimizers, a DataLoader, and a Trainer told to train for
1,000 epochs (Skyline stops it once measured)."""

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

BATCH_SIZE = 32


class Classifier(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU())
        self.head = nn.Linear(128, 10)

    def forward(self, x):
        return self.head(self.body(x))  # FORWARD

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self(x), y)  # LOSS
        self.log("loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def main():
    data = TensorDataset(torch.randn(2048, 64), torch.randint(0, 10, (2048,)))
    loader = DataLoader(data, batch_size=BATCH_SIZE, shuffle=True)
    trainer = L.Trainer(
        max_epochs=1000,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(Classifier(), loader)


if __name__ == "__main__":
    main()
