"""Rank programs that tests and benchmarks share (one copy, so the lines they assert on, such
as `cell.py:8`, cannot drift apart)."""

from __future__ import annotations

import textwrap

# A hung job: every rank but 1 waits in all_reduce (train_step, cell.py:8) for rank 1, which
# sleeps. "ready" is printed by each rank once its process group is up.
HANG = textwrap.dedent(
    """\
    import time
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")

    def train_step(t):
        dist.all_reduce(t)

    print("ready", flush=True)
    if dist.get_rank() == 1:
        time.sleep(600)
    train_step(torch.ones(2))
    """
)
