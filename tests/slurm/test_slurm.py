"""The slurm backend against a real one-node Slurm (conftest.py: munged, slurmctld, slurmd).

Each test leaves nothing in squeue (the `slurm_store` fixture checks it). The node has 2
CPUs: a 2-rank job fills it, so a second one must wait in Slurm's queue.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from helpers import run_cli, wait_for
from jupyterlab_mlcluster.jobs.model import JobSpec, JobState, SpecError
from jupyterlab_mlcluster.runtime.payload import Payload

ALL_REDUCE = textwrap.dedent(
    """
    import os, torch, torch.distributed as dist
    dist.init_process_group("gloo")
    t = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(t)
    print(f"sum={t.item()} rank={dist.get_rank()} slurm_job={os.environ['SLURM_JOB_ID']}", flush=True)
    dist.destroy_process_group()
    """
)


def submit(service, source: str, **options):
    push = options.pop("push", {})
    pull = options.pop("pull", [])
    spec = JobSpec.from_options({"backend": "slurm", **options})
    return service.submit(spec, Payload(source=source, push=push, pull=pull))


@pytest.fixture
def service(slurm_store):
    from jupyterlab_mlcluster.jobs.service import JobService

    svc = JobService()
    yield svc
    for record in svc.store.list_jobs()[0]:
        if not record.final:
            svc.cancel(record.id)


def test_cli_runs_a_two_rank_gloo_job_in_one_srun_step(slurm_store, slurm, tmp_path):
    script = tmp_path / "allreduce.py"
    script.write_text(ALL_REDUCE)
    proc = run_cli("run", "--backend", "slurm", "--workers", "2", "--name", "ar", str(script))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    found = [dict(re.findall(r"(\w+)=(\S+)", line)) for line in proc.stdout.splitlines()]
    found = [f for f in found if "sum" in f]
    assert sorted(f["rank"] for f in found) == ["0", "1"], proc.stdout
    assert all(f["sum"] == "3.0" for f in found)
    assert len({f["slurm_job"] for f in found}) == 1  # both ranks in the same allocation
    listing = run_cli("jobs")
    assert "ar" in listing.stdout and "succeeded" in listing.stdout


def test_ranks_get_the_torchrun_environment_from_slurms(service, slurm):
    code = textwrap.dedent(
        """
        import os, json
        keys = ["RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "OMP_NUM_THREADS",
                "SLURM_PROCID", "MY_FLAG"]
        print(json.dumps({k: os.environ.get(k) for k in keys}))
        """
    )
    job = submit(service, code, workers=2, env={"MY_FLAG": "on"})
    record = service.wait(job.id, timeout=60)
    assert record.state == JobState.SUCCEEDED, record.error
    envs = {line["rank"]: json.loads(line["line"]) for line in service.logs(job.id)[0]}
    assert sorted(envs) == [0, 1]
    assert len({e["MASTER_PORT"] for e in envs.values()}) == 1
    for rank, env in envs.items():
        assert env["RANK"] == env["LOCAL_RANK"] == env["SLURM_PROCID"] == str(rank)
        assert env["WORLD_SIZE"] == env["LOCAL_WORLD_SIZE"] == "2"
        assert env["GROUP_RANK"] == "0"
        assert env["MASTER_ADDR"] == slurm.node
        assert env["TORCHELASTIC_RUN_ID"] == job.id
        assert env["OMP_NUM_THREADS"] == "1" and env["MY_FLAG"] == "on"
    assert [r.state for r in record.ranks] == ["succeeded", "succeeded"]
