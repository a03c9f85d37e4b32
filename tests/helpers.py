"""Helpers shared by the tests (imported as a plain module; fixtures stay in conftest)."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def job_processes(service, job_id: str) -> list[psutil.Process]:
    """Live processes (supervisor and ranks) of a job, matched by pid and start time."""
    from jupyterlab_mlcluster.backends.local.pool import process_is

    found = []
    record = service.store.get_job(job_id)
    sup = record.supervisor or {}
    if process_is(sup.get("pid"), sup.get("create_time")):
        found.append(psutil.Process(sup["pid"]))
    rows = service.store._db.execute(
        "SELECT pid, pgid FROM ranks WHERE job_id = ?", (job_id,)
    ).fetchall()
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


def process_gone(pid: int) -> bool:
    """The process has exited (gone, or a zombie its parent has yet to reap). It may vanish
    between two looks, so asking about it is part of the answer."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


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
