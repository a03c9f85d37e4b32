"""Shared fixtures: an isolated job store per test, and checks that nothing is left running."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session", autouse=True)
def warm_pool_dir(tmp_path_factory):
    """Zygotes of this test session live here (not in a developer's pool) and are stopped
    at the end."""
    path = tmp_path_factory.mktemp("warm-pool")
    old = os.environ.get("MLCLUSTER_WARM_POOL_DIR")
    os.environ["MLCLUSTER_WARM_POOL_DIR"] = str(path)
    yield path
    from jupyterlab_mlcluster.backends.local import warmpool

    for sock in path.glob("zygote-*.sock"):
        try:
            info = warmpool.request(sock, {"op": "ping"}, timeout=2)
            warmpool.request(sock, {"op": "stop"}, timeout=2)
            psutil.Process(info["pid"]).wait(10)
        except Exception:  # noqa: BLE001 - already gone
            pass
    if old is None:
        os.environ.pop("MLCLUSTER_WARM_POOL_DIR", None)
    else:
        os.environ["MLCLUSTER_WARM_POOL_DIR"] = old


@pytest.fixture(params=["warm", "cold"])
def pool_mode(request, monkeypatch):
    """Run a test with ranks from the warm pool and with cold interpreters."""
    monkeypatch.setenv("MLCLUSTER_WARM_POOL", "1" if request.param == "warm" else "0")
    return request.param


@pytest.fixture
def store_dir(tmp_path, monkeypatch):
    """A fresh job store for this test; every process started from here inherits it."""
    path = tmp_path / "store"
    monkeypatch.setenv("MLCLUSTER_STORE_DIR", str(path))
    monkeypatch.setenv("JUPYTER_CONFIG_DIR", str(tmp_path / "jupyter-config"))
    return path


@pytest.fixture
def service(store_dir):
    from jupyterlab_mlcluster.jobs.service import JobService

    svc = JobService()
    yield svc
    # Nothing of any job may outlive the test.
    for record in svc.store.list_jobs()[0]:
        if not record.final:
            svc.cancel(record.id)
    assert_no_job_processes(svc)


def job_processes(service, job_id: str) -> list[psutil.Process]:
    """Live processes (supervisor and ranks) of a job, matched by pid and start time."""
    from jupyterlab_mlcluster.backends.local.pool import process_is

    found = []
    record = service.store.get_job(job_id)
    sup = record.supervisor or {}
    if process_is(sup.get("pid"), sup.get("create_time")):
        found.append(psutil.Process(sup["pid"]))
    rows = service.store._db.execute("SELECT pid, pgid FROM ranks WHERE job_id = ?", (job_id,)).fetchall()
    for row in rows:
        if process_is(row["pid"], row["pgid"]):
            found.append(psutil.Process(row["pid"]))
    return found


def assert_no_job_processes(service, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        left = [p for r in service.store.list_jobs()[0] for p in job_processes(service, r.id)]
        if not left:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"processes left behind: {[(p.pid, p.cmdline()) for p in left]}")
        time.sleep(0.1)


def run_cli(*args: str, timeout: float = 120, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "jupyterlab_mlcluster.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        **kwargs,
    )


def wait_for(predicate, timeout: float = 30.0, interval: float = 0.05, message: str = "condition"):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {message}")
        time.sleep(interval)
