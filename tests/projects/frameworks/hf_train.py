"""A Hugging Face model trained by transformers' Trainer, as its documentation shows: a model built
from its config (nothing downloaded), a dataset of dicts, TrainingArguments with the batch size, and
a Trainer told to train for 1,000 epochs (Skyline stops it once measured)."""

import torch
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments


class Sentences(torch.utils.data.Dataset):
    def __init__(self, count, length, vocabulary):
        self.input_ids = torch.randint(0, vocabulary, (count, length))
        self.labels = torch.randint(0, 2, (count,))

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, index):
        return {"input_ids": self.input_ids[index], "labels": self.labels[index]}


def main():
    config = BertConfig(
        vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128
    )
    model = BertForSequenceClassification(config)
    arguments = TrainingArguments(
        output_dir="hf-output",
        per_device_train_batch_size=16,
        num_train_epochs=1000,
        save_strategy="no",
        report_to=[],
        logging_strategy="no",
        disable_tqdm=True,
        use_cpu=True,
    )
    trainer = Trainer(model=model, args=arguments, train_dataset=Sentences(512, 32, config.vocab_size))
    trainer.train()


if __name__ == "__main__":
    main()
