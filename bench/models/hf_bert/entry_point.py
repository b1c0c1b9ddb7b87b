"""The benchmark's Hugging Face model: a tiny BERT for sequence classification, built from its
config with `transformers` (a bench extra, never the plugin's dependency), whose import is most of
a save's wait unless the service's spare worker made it ahead (measure/import_ahead.py)."""

import torch
from transformers import BertConfig, BertForSequenceClassification


def skyline_model_provider():
    config = BertConfig(
        vocab_size=1000, hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128
    )
    return BertForSequenceClassification(config)


def skyline_input_provider(batch_size=8):
    return torch.randint(0, 1000, (batch_size, 32)), torch.randint(0, 2, (batch_size,))


def skyline_iteration_provider(model):
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def iteration(tokens, labels):
        optimizer.zero_grad()
        model(input_ids=tokens, labels=labels).loss.backward()
        optimizer.step()

    return iteration
