"""A PyTorch Lightning Trainer(strategy="ddp") on CPU: a tiny regression, synthetic data."""

import json
import os

import lightning as L
import torch


class Tiny(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch, _):
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


L.seed_everything(0, verbose=False)
g = torch.Generator().manual_seed(0)
x = torch.randn(64, 4, generator=g)
y = x.sum(dim=1, keepdim=True)
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=8)
model = Tiny()
trainer = L.Trainer(
    accelerator="cpu",
    devices=2,
    strategy="ddp",
    max_epochs=2,
    logger=False,
    enable_checkpointing=False,
    enable_progress_bar=False,
    enable_model_summary=False,
    default_root_dir=os.environ.get("LT_OUT", "lt-out"),
)
trainer.fit(model, loader)
w = [round(v, 5) for v in model.layer.weight.detach().flatten().tolist()]
print(
    "RESULT "
    + json.dumps(
        {
            "rank": trainer.global_rank,
            "world": trainer.world_size,
            "steps": trainer.global_step,
            "weights": w,
        }
    )
)
