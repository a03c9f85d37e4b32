"""DataLoader(num_workers=2, persistent_workers=True) in a DDP rank; the workers are still
alive when the script ends (the interpreter's shutdown stops them)."""

import json

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
data = torch.utils.data.TensorDataset(torch.arange(64, dtype=torch.float32))
sampler = torch.utils.data.distributed.DistributedSampler(data, shuffle=False)
loader = torch.utils.data.DataLoader(
    data, batch_size=8, sampler=sampler, num_workers=2, persistent_workers=True
)
local = sum(batch[0].sum() for epoch in range(2) for batch in loader)
total = local.clone()
dist.all_reduce(total)
print(
    "RESULT " + json.dumps({"rank": dist.get_rank(), "local": local.item(), "total": total.item()})
)
