"""Jobs of other hosts sharing a store (a home on NFS): their supervisors are judged by the
heartbeat they write, not by a pid that means nothing here. A dead host's job is reaped to
`failed` saying so; a live host's job stays running, cannot be claimed from it, and is not
purged while its supervisor beats."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

import pytest

from jupyterlab_mlcluster.config import MLClusterConfig
from jupyterlab_mlcluster.jobs.model import JobSpec, JobState, RankState
from jupyterlab_mlcluster.jobs.record import JobRecord
from jupyterlab_mlcluster.jobs.running import processes
from jupyterlab_mlcluster.jobs.running.processes import HEARTBEAT_STALE, holder_alive, this_host
from jupyterlab_mlcluster.jobs.service import JobService, new_job_id
from jupyterlab_mlcluster.jobs.storage.store import JobStore

OTHER = {"pid": 4242, "create_time": 1_700_000_000.0, "host": "gpu-node-7.cluster"}


def _remote_job(store: JobStore, heartbeat: float | None) -> str:
    """A running 2-rank job as another host's supervisor would have left it in the store."""
    spec = JobSpec.from_options({"workers": 2})
    job_id = new_job_id()
    store.insert_job(
        JobRecord(id=job_id, name="remote", spec=spec, state=JobState.QUEUED, created=time.time()),
        b"payload",
    )
    assert store.claim_supervisor(job_id, OTHER, lambda *_: False)
    store.transition(job_id, JobState.RUNNING, started=time.time())
    rank = {"state": RankState.RUNNING, "process_start": 1.0, "host": OTHER["host"]}
    store.update_ranks(job_id, {r: {**rank, "pid": 999_000 + r} for r in (0, 1)})
    store.update_job(job_id, heartbeat=heartbeat)
    return job_id


@pytest.fixture
def jobs(store_dir):
    svc = JobService(MLClusterConfig(kill_grace_period=0.0, warm_pool=False))
    yield svc
    svc.store.close()


def test_liveness_rule():
    now = time.time()
    assert HEARTBEAT_STALE >= 3 * processes.HEARTBEAT_INTERVAL
    assert holder_alive(OTHER, now - 1)
    assert holder_alive(OTHER, now - HEARTBEAT_STALE + 5)
    assert not holder_alive(OTHER, now - HEARTBEAT_STALE - 1)
    assert not holder_alive(OTHER, None)  # claimed, never beat
    assert not holder_alive(None, now)
    # On this host the process itself decides, whatever the heartbeat says.
    gone = {"pid": 4242, "create_time": 1.0, "host": this_host()}
    assert not holder_alive(gone, now)


@contextlib.contextmanager
def beating(store: JobStore, job_id: str) -> Iterator[None]:
    """The other host's supervisor meanwhile: alive (its heartbeat fresh), and slow to honour
    a cancel."""
    stop = threading.Event()

    def beat():
        while not stop.is_set():
            store.update_job(job_id, event="heartbeat", heartbeat=time.time())
            stop.wait(processes.HEARTBEAT_INTERVAL / 4)

    beater = threading.Thread(target=beat, daemon=True)
    beater.start()
    try:
        yield
    finally:
        stop.set()
        beater.join()


def test_a_dead_hosts_job_is_reaped_to_failed(jobs):
    job_id = _remote_job(jobs.store, heartbeat=time.time() - HEARTBEAT_STALE - 30)
    assert job_id in jobs.reap(force=True)
    record = jobs.store.get_job(job_id)
    assert record.state == JobState.FAILED
    assert "gpu-node-7.cluster" in record.reason and "stopped answering" in record.reason
    assert "last beat" in record.reason and record.error == record.reason
    assert {r.state for r in record.ranks} == {RankState.CANCELLED}
    # Nothing of it can run here: a purge forgets it.
    assert jobs.cancel(job_id, purge=True) is None


def test_a_live_hosts_job_stays_running_and_is_not_taken_over(jobs):
    job_id = _remote_job(jobs.store, heartbeat=time.time())
    with beating(jobs.store, job_id):
        assert jobs.reap(force=True) == []
        assert jobs.store.get_job(job_id).state == JobState.RUNNING
        # No supervisor here can take it over while it beats.
        me = {"pid": 1, "create_time": 2.0, "host": this_host()}
        assert not jobs.store.claim_supervisor(job_id, me, holder_alive)


def test_a_live_host_that_honours_the_cancel_is_purged(jobs):
    """The other host's supervisor sees the cancel flag and ends its job: then the purge
    goes through (a supervisor makes its job final only after stopping its ranks)."""
    job_id = _remote_job(jobs.store, heartbeat=time.time())
    stop = threading.Event()

    def remote_supervisor():
        store = JobStore(jobs.store.root)
        while not stop.is_set():
            store.update_job(job_id, event="heartbeat", heartbeat=time.time())
            if store.cancel_requested(job_id):
                store.transition(job_id, JobState.CANCELLED, reason="cancelled by user")
                return
            stop.wait(0.05)

    remote = threading.Thread(target=remote_supervisor, daemon=True)
    remote.start()
    try:
        assert jobs.cancel(job_id, purge=True) is None
        assert job_id not in jobs.store.job_owners()
        assert not jobs.store.job_dir(job_id).exists()
    finally:
        stop.set()
        remote.join()


def test_a_stale_claim_is_taken_over(jobs):
    """A supervisor starting for a job whose holder's host stopped beating may claim it."""
    job_id = _remote_job(jobs.store, heartbeat=time.time() - HEARTBEAT_STALE - 1)
    me = {"pid": 1, "create_time": 2.0, "host": this_host()}
    assert jobs.store.claim_supervisor(job_id, me, holder_alive)
    assert jobs.store.get_job(job_id).supervisor == me


def test_the_cli_refuses_to_purge_a_live_hosts_job(jobs, tmp_path, monkeypatch):
    """`mlcluster cancel --purge` (JobService.cancel) of a job whose supervisor on another
    host still beats: the cancel is asked of that supervisor, then a clear error, exit
    status 1, the job still there."""
    import json

    from helpers import run_cli

    config_dir = tmp_path / "jupyter-config"
    config_dir.mkdir(exist_ok=True)
    (config_dir / "jupyter_mlcluster_config.json").write_text(
        json.dumps({"MLClusterConfig": {"kill_grace_period": 0}})
    )
    monkeypatch.setenv("JUPYTER_CONFIG_DIR", str(config_dir))
    job_id = _remote_job(jobs.store, heartbeat=time.time())
    with beating(jobs.store, job_id):
        done = run_cli("cancel", job_id, "--purge")
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert f"job {job_id} was not purged" in done.stderr and "gpu-node-7" in done.stderr
    assert "Traceback" not in done.stderr
    record = jobs.store.get_job(job_id)
    assert record.state == JobState.RUNNING and record.cancel_requested
    assert "gpu-node-7.cluster" in jobs.still_running(record)
