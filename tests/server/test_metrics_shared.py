"""/metrics of a server shared through the trusted identity header (issue 22): any of its
users may read it, so no series names a user's job ids, job names or identity. A real
Jupyter server, a real running job with live rank figures."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest

from jupyterlab_mlcluster.jobs.model import JobSpec, JobState
from jupyterlab_mlcluster.jobs.record import JobRecord, RankRecord
from jupyterlab_mlcluster.server.metrics import build_metrics

ALICE, BOB = "alice@example.com", "bob@example.com"


@pytest.fixture
def mlc_config() -> dict[str, Any]:
    return {
        "MLClusterApp": {
            "trust_identity_header": True,
            "allow_local_jobs_when_shared": True,  # a local job: no cluster needed here
            "metrics_interval": 0.2,
        },
        "MLClusterConfig": {"metrics_interval": 0.2},
    }


async def test_attack_shared_metrics_name_no_users_jobs(jp_fetch, mlc, tmp_path):
    release = tmp_path / "release"
    code = (
        "import pathlib, time\n"
        f"while not pathlib.Path({str(release)!r}).exists():\n"
        "    time.sleep(0.05)\n"
    )
    response = await jp_fetch(
        "mlcluster",
        "api",
        "jobs",
        method="POST",
        body=json.dumps({"code": code, "name": "alices-secret-run"}),
        headers={"kubeflow-userid": ALICE},
    )
    job = json.loads(response.body)
    try:
        deadline = time.monotonic() + 60
        while True:  # running, with figures of its ranks in the store
            record = mlc.service.store.get_job(job["id"])
            if record.state is JobState.RUNNING and any(r.metrics for r in record.ranks):
                break
            assert time.monotonic() < deadline, record
            await asyncio.sleep(0.1)
        since = time.time()
        while True:  # a snapshot read after that
            text = (
                await jp_fetch("metrics", method="GET", headers={"kubeflow-userid": BOB})
            ).body.decode()
            stamp = [
                float(line.split()[-1])
                for line in text.splitlines()
                if line.startswith("mlcluster_metrics_snapshot_timestamp_seconds ")
            ]
            if stamp and stamp[0] > since:
                break
            assert time.monotonic() < deadline
            await asyncio.sleep(0.1)
        assert 'mlcluster_jobs{backend="local",state="running"} 1.0' in text
        for secret in (job["id"], "alices-secret-run", ALICE):
            assert secret not in text, secret
    finally:
        release.touch()
        mlc.service.wait(job["id"], timeout=60)


def test_shared_metrics_keep_counts_and_drop_job_and_owner_labels():
    spec = JobSpec(workers=2, gpus_per_worker=1, backend="local")
    running = JobRecord(
        id="j1", name="secret", spec=spec, state=JobState.RUNNING, created=1.0, started=2.0,
        owner=ALICE, ranks=[RankRecord(0, metrics={"cpu_percent": 50.0})], gpu_idle_since=1.0,
    )  # fmt: skip
    families = build_metrics([running], None, now=10.0, shared=True)
    labels = {v for f in families for s in f.samples for v in s.labels.values()}
    assert not labels & {"j1", "secret", ALICE}, labels
    counts = {f.name: [s.value for s in f.samples] for f in families}
    assert counts["mlcluster_idle_gpu_jobs"] == [1]
    mine = {v for f in build_metrics([running], None, now=10.0) for s in f.samples
            for v in s.labels.values()}  # fmt: skip
    assert {"j1", "secret", ALICE} <= mine  # a server of one user's keeps them
