"""Training that loses no work to preemption: torch.distributed.checkpoint (DCP) saves the
model and optimizer every CKPT_EVERY steps and at once when SIGTERM comes (a Slurm
preemption or time limit, a pod's eviction, a cancel), and `--max-restarts` starts the
gang again, which resumes at the step it saved.

    mlcluster run --workers 2 --max-restarts 3 --env CKPT_DIR=/shared/ckpt examples/dcp_resume.py

CKPT_DIR must be a directory every rank reaches (the job's working directory on one
machine; a shared filesystem on Slurm or Kubernetes). The result (rank 0's last expression)
is the final step and weights: the same whether or not the job was interrupted.
"""

import os
import signal
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.nn.parallel import DistributedDataParallel

STEPS = int(os.environ.get("STEPS", "40"))
CKPT_EVERY = int(os.environ.get("CKPT_EVERY", "10"))
CKPT_DIR = Path(os.environ.get("CKPT_DIR", "checkpoints"))
STEP_SECONDS = float(os.environ.get("STEP_SECONDS", "0"))  # slows each step (a demo's)

# SIGTERM only raises a flag: the ranks agree on it at the end of a step and save together
# (a DCP save is collective), within the grace the job gives (kill_grace_period, Slurm's
# GraceTime or KillWait, the pod's terminationGracePeriodSeconds).
terminated = False


def on_sigterm(signum, frame):
    global terminated
    terminated = True


signal.signal(signal.SIGTERM, on_sigterm)

dist.init_process_group("gloo")
rank = dist.get_rank()
attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
torch.manual_seed(0)
model = DistributedDataParallel(torch.nn.Linear(16, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)


def saved_steps() -> list[int]:
    """Complete checkpoints only: DCP writes .metadata last, once every rank's shard is in."""
    return sorted(
        int(p.name.removeprefix("step-"))
        for p in CKPT_DIR.glob("step-*")
        if (p / ".metadata").exists()
    )


def save(step: int) -> None:
    model_state, optim_state = get_state_dict(model, optimizer)
    dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=CKPT_DIR / f"step-{step}")


# Resume: rank 0 picks the latest complete checkpoint and every rank loads it.
latest = [max(saved_steps(), default=0)]
dist.broadcast_object_list(latest, src=0)
start = latest[0]
if start:
    model_state, optim_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optim": optim_state}
    dcp.load(state, checkpoint_id=CKPT_DIR / f"step-{start}")
    set_state_dict(
        model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"]
    )
print(f"attempt {attempt}: starting at step {start}", flush=True)

for step in range(start, STEPS):
    # Each step's data depends on the step alone: an interrupted run ends as a straight one.
    data = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(32, 16, generator=data)
    loss = torch.nn.functional.mse_loss(model(x), x.sum(dim=1, keepdim=True))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    done = step + 1
    stop = torch.tensor([float(terminated)])
    dist.all_reduce(stop, op=dist.ReduceOp.MAX)  # one rank told is enough: all save
    if stop.item() or done % CKPT_EVERY == 0:
        save(done)
        print(f"saved step {done}", flush=True)
    if stop.item():
        print(f"SIGTERM: saved step {done}, exiting for a restart", flush=True)
        dist.destroy_process_group()
        sys.exit(128 + signal.SIGTERM)  # not 0: the job is not done
    time.sleep(STEP_SECONDS)

dist.destroy_process_group()
{"step": STEPS, "weights": [p.detach().flatten().tolist() for p in model.module.parameters()]}
