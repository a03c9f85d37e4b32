"""Jobs stored as a notebook stores them, for the export tests (tests/test_export.py,
tests/slurm/, tests/kube/): their files are what JobService writes at submit (job_files),
nothing of them runs."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from jupyterlab_mlcluster.jobs.model import JobSpec, JobState
from jupyterlab_mlcluster.jobs.record import JobRecord, new_job_id
from jupyterlab_mlcluster.runtime.payload import Payload

# Two ranks all-reduce a pushed number; rank 0 writes what it got, the world size, and a
# pushed function's answer (a lambda travels by value: cloudpickle) to $EXPORT_OUT.
CELL = """\
import os

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
total = torch.tensor([float(scale * (dist.get_rank() + 1))])
dist.all_reduce(total)
if dist.get_rank() == 0:
    with open(os.environ["EXPORT_OUT"], "w") as out:
        out.write(f"{total.item():g} {dist.get_world_size()} {double(greeting)}")
dist.destroy_process_group()
"""


def store_cell_job(
    service: Any,
    *,
    env: dict[str, str] | None = None,
    push: dict[str, Any] | None = None,
    workers: int = 2,
    owner: str | None = None,
    source: str = CELL,
    origin: dict[str, Any] | None = None,
    state: JobState = JobState.SUCCEEDED,
    **spec: Any,
) -> JobRecord:
    """A finished 2-rank cell of train.ipynb (cell [4]) with its pushed variables."""
    payload = Payload(
        kind="code",
        source=source,
        first_line=2,
        push=push
        if push is not None
        else {"scale": 3, "greeting": "hi", "double": lambda s: s * 2},
        cwd=str(Path.cwd()),
    )
    job_id = new_job_id()
    data, files = service.job_files(job_id, payload, None, None)
    record = JobRecord(
        id=job_id,
        name="train-cell4",
        spec=JobSpec(workers=workers, env=dict(env or {}), **spec),
        created=time.time(),
        owner=owner or service_owner(),
        origin={"kind": "kernel", "notebook": "train.ipynb", "cell": 4, **(origin or {})},
    )
    service.store.insert_job(record, data, files)
    service.store.transition(job_id, state, started=time.time(), finished=time.time())
    return service.store.get_job(job_id)


def service_owner() -> str:
    from jupyterlab_mlcluster.jobs.owner import current_user

    return current_user()
