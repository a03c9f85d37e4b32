"""Others' training APIs, one after the other in the same 2 ranks (their imports are paid once):
DataLoader(num_workers=2, persistent_workers=True), torch.compile, a Hugging Face Trainer on
a tiny BERT built from a config, a PyTorch Lightning Trainer(strategy="ddp"). CPU, synthetic
data, no downloads. Each prints `RESULT {json}` with what it computed on this rank. Under
mlcluster, the Trainer's callback, the Lightning logger and a SummaryWriter also fill the
job's series (mlc.log; nothing outside a job), which test_compat reads back.
"""

import json
import os

import torch
import torch.distributed as dist

import jupyterlab_mlcluster as mlc


def report(case, **values):
    print("RESULT " + json.dumps({"case": case, "rank": dist.get_rank(), **values}), flush=True)


def rounded(tensor, n=4):
    return [round(v, 4) for v in tensor.detach().flatten().tolist()[:n]]


dist.init_process_group("gloo")

# -- DataLoader workers still alive when the script ends (the interpreter's shutdown stops them)
data = torch.utils.data.TensorDataset(torch.arange(64, dtype=torch.float32))
sampler = torch.utils.data.distributed.DistributedSampler(data, shuffle=False)
loader = torch.utils.data.DataLoader(
    data, batch_size=8, sampler=sampler, num_workers=2, persistent_workers=True
)
local = sum(batch[0].sum() for epoch in range(2) for batch in loader)
total = local.clone()
dist.all_reduce(total)
report("dataloader", local=local.item(), total=total.item())

# -- torch.compile: the eager backend runs Dynamo's tracing and guards without generating
# code (inductor's C++ compilation takes minutes on a small CI machine).
torch.manual_seed(0)
linear = torch.nn.Linear(8, 2)
step = torch.compile(lambda x: linear(x).pow(2).sum(), backend="eager")
loss = step(torch.ones(4, 8) * (dist.get_rank() + 1))
loss.backward()
grad = linear.weight.grad.clone()
dist.all_reduce(grad)
report("compile", loss=round(loss.item(), 4), grad=rounded(grad))

# -- Hugging Face Trainer (its accelerate state joins the process group above)
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
bert = BertForSequenceClassification(config)
ids = torch.randint(0, 64, (32, 8), generator=torch.Generator().manual_seed(0))
labels = ids.sum(dim=1) % 2


class Tokens(torch.utils.data.Dataset):
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
    logging_strategy="steps",
    logging_steps=1,
    use_cpu=True,
    seed=0,
    disable_tqdm=True,
)
trainer = Trainer(model=bert, args=args, train_dataset=Tokens(), callbacks=[mlc.TrainerCallback()])
result = trainer.train()
weights = sum(p.detach().double().sum().item() for p in bert.parameters())
report(
    "hf_trainer",
    world=trainer.args.world_size,
    steps=result.global_step,
    loss=round(result.training_loss, 4),
    weights=round(weights, 3),
)

# -- PyTorch Lightning, strategy="ddp" on CPU (it finds torchrun's variables in the environment)
import lightning as L


class Tiny(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch, _):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.layer(x), y)
        self.log("lightning_loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


L.seed_everything(0, verbose=False)
x = torch.randn(64, 4, generator=torch.Generator().manual_seed(0))
y = x.sum(dim=1, keepdim=True)
tiny = Tiny()
lightning_trainer = L.Trainer(
    accelerator="cpu",
    devices=2,
    strategy="ddp",
    max_epochs=2,
    logger=mlc.LightningLogger(),
    log_every_n_steps=1,
    enable_checkpointing=False,
    enable_progress_bar=False,
    enable_model_summary=False,
    default_root_dir=os.environ.get("LT_OUT", "lt-out"),
)
lightning_trainer.fit(
    tiny, torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=8)
)
report(
    "lightning",
    world=lightning_trainer.world_size,
    steps=lightning_trainer.global_step,
    weights=rounded(tiny.layer.weight),
)

# -- TensorBoard scalars, where the job's directory is (mlcluster gives each job one)
if os.environ.get("MLCLUSTER_TENSORBOARD_DIR") and dist.get_rank() == 0:
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(os.environ["MLCLUSTER_TENSORBOARD_DIR"])
    for i in range(3):
        writer.add_scalar("tb/loss", 1.0 / (i + 1), i)
    writer.close()
