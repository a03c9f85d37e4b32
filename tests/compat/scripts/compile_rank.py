"""torch.compile in each DDP rank. The aot_eager backend traces with Dynamo and AOTAutograd
without generating C++ (inductor's CPU code generation takes minutes on a small CI machine)."""

import json

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 2))
step = torch.compile(lambda x: model(x).pow(2).sum(), backend="aot_eager")
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(3):
    optimizer.zero_grad()
    loss = step(torch.ones(4, 8) * (dist.get_rank() + 1))
    loss.backward()
    optimizer.step()
weights = [round(v, 5) for v in model.module.weight.detach().flatten().tolist()[:4]]
print("RESULT " + json.dumps({"rank": dist.get_rank(), "weights": weights}))
