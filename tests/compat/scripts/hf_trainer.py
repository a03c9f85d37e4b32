"""A Hugging Face Trainer on a tiny BERT built from a config (no downloads), synthetic data."""

import json
import os

import torch
from transformers import (
    BertConfig,
    BertForSequenceClassification,
    Trainer,
    TrainingArguments,
    set_seed,
)

set_seed(0)
config = BertConfig(
    vocab_size=64,
    hidden_size=16,
    num_hidden_layers=1,
    num_attention_heads=2,
    intermediate_size=32,
    max_position_embeddings=16,
    num_labels=2,
)
model = BertForSequenceClassification(config)
g = torch.Generator().manual_seed(0)
ids = torch.randint(0, 64, (32, 8), generator=g)
labels = ids.sum(dim=1) % 2


class Data(torch.utils.data.Dataset):
    def __len__(self):
        return len(ids)

    def __getitem__(self, i):
        return {"input_ids": ids[i], "labels": labels[i]}


args = TrainingArguments(
    output_dir=os.environ.get("HF_OUT", "hf-out"),
    per_device_train_batch_size=4,
    num_train_epochs=1,
    learning_rate=1e-2,
    report_to=[],
    save_strategy="no",
    logging_strategy="no",
    use_cpu=True,
    seed=0,
    disable_tqdm=True,
)
trainer = Trainer(model=model, args=args, train_dataset=Data())
result = trainer.train()
w = sum(p.detach().double().sum().item() for p in model.parameters())
print(
    "RESULT "
    + json.dumps(
        {
            "rank": int(os.environ["RANK"]),
            "world": trainer.args.world_size,
            "steps": result.global_step,
            "loss": round(result.training_loss, 5),
            "weights": round(w, 4),
        }
    )
)
