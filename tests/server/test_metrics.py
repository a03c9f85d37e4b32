"""The extension's mlcluster_* series on Jupyter Server's own /metrics."""

from __future__ import annotations

import asyncio
import datetime
import json
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from jupyterlab_mlcluster.jobs.model import JobSpec, JobState
from jupyterlab_mlcluster.jobs.record import JobRecord, RankRecord
from jupyterlab_mlcluster.runtime import nvml
from jupyterlab_mlcluster.server.metrics import SERIES, build_metrics

from .helpers import submit, wait_final


@pytest.fixture
def mlc_config():
    # Two GPUs in the local pool (this machine has none: their figures come from the test
    # NVML file), and a job flagged once its GPUs idle for 1 s.
    return {
        "MLClusterApp": {"metrics_interval": 0.2},
        "MLClusterConfig": {"gpus": "0,1", "idle_gpu_after": 1.0, "metrics_interval": 0.2},
    }


async def scrape(jp_fetch) -> dict[str, list]:
    """name -> samples of every mlcluster_* family on /metrics (with the server's token)."""
    response = await jp_fetch("metrics", method="GET")
    families: dict[str, list] = {}
    for family in text_string_to_metric_families(response.body.decode()):
        if family.name.startswith("mlcluster_"):
            families.setdefault(family.name, []).extend(family.samples)
    return families


def value(families, series: str, **labels) -> float | None:
    for sample in families.get(series.removesuffix("_count").removesuffix("_total"), []):
        if sample.name == series and all(sample.labels.get(k) == v for k, v in labels.items()):
            return sample.value
    return None


async def wait_for(jp_fetch, predicate, timeout: float = 60.0):
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        families = await scrape(jp_fetch)
        if predicate(families):
            return families
        assert asyncio.get_running_loop().time() < deadline, sorted(families)
        await asyncio.sleep(0.2)


async def test_series_follow_a_job_through_its_states(api, mlc, jp_fetch, tmp_path, monkeypatch):
    """One 2-rank job holding a GPU per rank: state, capacity and rank series as it runs,
    and the idle-GPU flag (REST field and series) raised only after the GPUs have idled
    for idle_gpu_after, cleared when they work again."""
    gpus = tmp_path / "gpus.json"
    gpus.write_text(json.dumps({"0": 1, "1": 2}))
    monkeypatch.setenv(nvml.TEST_FILE_ENV, str(gpus))  # the job's supervisor inherits it
    release = tmp_path / "release"
    before = await wait_for(jp_fetch, lambda f: "mlcluster_jobs" in f)
    assert value(before, "mlcluster_jobs", state="running", backend="local") == 0
    assert value(before, "mlcluster_cpu_slots_capacity", backend="local") > 0
    assert value(before, "mlcluster_gpus_capacity", backend="local") == 2
    code = (
        "import os, time\nx = sum(range(10**6))\n"
        f"while not os.path.exists({str(release)!r}):\n    time.sleep(0.05)"
    )
    job = await submit(api, code, workers=2, gpus_per_worker=1, name="metered")
    running = await wait_for(
        jp_fetch,
        lambda f: (
            value(f, "mlcluster_jobs", state="running", backend="local") == 1
            and value(f, "mlcluster_rank_memory_bytes", job=job["id"], rank="1") is not None
        ),
    )
    assert value(running, "mlcluster_cpu_slots_allocated", backend="local") == 2
    assert value(running, "mlcluster_gpus_allocated", backend="local") == 2
    assert value(running, "mlcluster_rank_memory_bytes", job=job["id"], name="metered") > 0

    idle = await wait_for_job(api, job["id"], lambda j: j["gpu_idle_since"] is not None)
    seen = time.time()
    since = datetime.datetime.fromisoformat(idle["gpu_idle_since"]).timestamp()
    started = datetime.datetime.fromisoformat(idle["started"]).timestamp()
    assert started <= since <= seen - 1.0, "flagged before its GPUs idled idle_gpu_after"
    assert {r["metrics"]["gpu_util"] for r in idle["ranks"]} == {1, 2}
    flagged = await wait_for(
        jp_fetch, lambda f: value(f, "mlcluster_idle_gpu_jobs", backend="local") == 1
    )
    assert value(flagged, "mlcluster_job_gpu_idle_seconds", job=job["id"], name="metered") >= 1.0
    assert value(flagged, "mlcluster_rank_gpu_utilization_percent", job=job["id"], rank="1") == 2

    gpus.write_text(json.dumps({"0": 1, "1": 90}))  # one rank's GPU works again: not idle
    await wait_for_job(api, job["id"], lambda j: j["gpu_idle_since"] is None)
    busy = await wait_for(
        jp_fetch, lambda f: value(f, "mlcluster_idle_gpu_jobs", backend="local") == 0
    )
    assert value(busy, "mlcluster_job_gpu_idle_seconds", job=job["id"]) is None

    release.touch()
    assert (await wait_final(api, job["id"]))["state"] == "succeeded"
    after = await wait_for(
        jp_fetch,
        lambda f: value(f, "mlcluster_jobs", state="succeeded", backend="local") == 1,
    )
    assert value(after, "mlcluster_jobs", state="running", backend="local") == 0
    assert value(after, "mlcluster_rank_memory_bytes", job=job["id"]) is None
    assert value(after, "mlcluster_job_duration_seconds_count", state="succeeded") == 1
    assert value(after, "mlcluster_job_admission_seconds_count", backend="local") == 1
    assert value(after, "mlcluster_cpu_slots_allocated", backend="local") == 0
    assert value(after, "mlcluster_gpus_allocated", backend="local") == 0


async def wait_for_job(api, job_id: str, predicate, timeout: float = 60.0) -> dict:
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        code, job, _ = await api("GET", "jobs", job_id)
        assert code == 200 and job["state"] == "running", job
        if predicate(job):
            return job
        assert asyncio.get_running_loop().time() < deadline, job
        await asyncio.sleep(0.1)


async def test_metrics_need_the_servers_authentication(mlc, jp_fetch):
    from tornado.httpclient import HTTPClientError

    with pytest.raises(HTTPClientError) as refused:
        await jp_fetch("metrics", method="GET", headers={"Authorization": ""})
    assert refused.value.code == 403


def _job(id, state, backend="local", created=100.0, started=None, finished=None, **kw):
    spec = JobSpec(workers=2, gpus_per_worker=1, backend=backend)
    return JobRecord(
        id=id, name=id, spec=spec, state=state, created=created, started=started,
        finished=finished, **kw,
    )  # fmt: skip


def test_build_metrics_counts_states_queue_durations_and_owners():
    jobs = [
        _job("j1", JobState.QUEUED, created=90.0),
        _job("j2", JobState.QUEUED, created=95.0),
        _job(
            "j3",
            JobState.RUNNING,
            started=101.0,
            owner="alice",
            ranks=[RankRecord(0, metrics={"gpu_util": 3.0, "cpu_percent": None})],
            gpu_idle_since=40.0,
        ),
        _job("j4", JobState.SUCCEEDED, started=102.0, finished=132.0, restarts=2),
        _job("j5", JobState.FAILED, backend="kubernetes", started=110.0, finished=111.0),
    ]
    cluster = {
        "backend": "local",
        "capacity": {"gpus": {"total": 8, "free": 6}, "cpus": {"total": 4, "free": 4}},
    }
    families = {f.name: f for f in build_metrics(jobs, cluster, now=100.0)}
    assert set(families) == {n.removesuffix("_total") if SERIES[n][0] == "counter" else n
                             for n in SERIES}  # fmt: skip

    def sample(name, suffix="", **labels):
        family = families[name]
        return [
            s.value
            for s in family.samples
            if s.name == name + suffix and all(s.labels.get(k) == v for k, v in labels.items())
        ]

    assert sample("mlcluster_jobs", state="queued", backend="local") == [2]
    assert sample("mlcluster_jobs", state="failed", backend="kubernetes") == [1]
    assert sample("mlcluster_jobs", state="running", backend="kubernetes") == [0]
    assert sample("mlcluster_queue_length", backend="local") == [2]
    assert sample("mlcluster_queue_oldest_wait_seconds", backend="local") == [10.0]
    assert sample("mlcluster_job_duration_seconds", "_sum", state="succeeded") == [30.0]
    assert sample("mlcluster_job_duration_seconds", "_bucket", state="succeeded", le="15.0") == [0]
    assert sample("mlcluster_job_duration_seconds", "_bucket", state="succeeded", le="60.0") == [1]
    assert sample("mlcluster_job_restarts", "_total", backend="local") == [2]
    assert sample("mlcluster_gpus_allocated", backend="local") == [2]
    assert sample("mlcluster_user_gpus_allocated", owner="alice") == [2]
    assert sample("mlcluster_rank_gpu_utilization_percent", job="j3", rank="0") == [3.0]
    assert sample("mlcluster_rank_cpu_percent") == []  # no figure: no sample, not a 0
    assert sample("mlcluster_idle_gpu_jobs", backend="local") == [1]
    assert sample("mlcluster_idle_gpu_jobs", backend="kubernetes") == [0]
    assert sample("mlcluster_idle_gpus", owner="alice") == [2]
    assert sample("mlcluster_job_gpu_idle_seconds", job="j3", owner="alice") == [60.0]
