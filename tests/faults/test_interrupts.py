"""Ctrl-C at every line of a submission (a kernel's interrupt button, the CLI's Ctrl-C): a
KeyboardInterrupt is raised at the n-th line the job store's modules run, for every n, and
what is left must be whole: a job's row and its directory together or neither, no staging
directory, no write lock held against other processes, and every trial of a sweep cut
short cancelled (never run, never failed as "never started").

The interrupt comes from a trace function, so it lands at each line in turn, deterministic.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import sys
import time
from pathlib import Path

import psutil
import pytest
from helpers import assert_no_job_processes

from jupyterlab_mlcluster.jobs.experiments.sweep import submit_sweep
from jupyterlab_mlcluster.jobs.experiments.sweeps import parse_sweep
from jupyterlab_mlcluster.jobs.model import JobSpec, JobState
from jupyterlab_mlcluster.jobs.record import JobRecord
from jupyterlab_mlcluster.jobs.running.processes import CLAIM_GRACE, this_host
from jupyterlab_mlcluster.jobs.storage.store import STAGING_PREFIX, JobStore
from jupyterlab_mlcluster.runtime.payload import Payload

# The modules whose lines an interrupt may land on (the job store's are store*.py, database.py).
# contextlib: an interrupt can land in a `with` statement's own machinery, after a COMMIT.
STORE_FILES = (
    "jobs/storage/store.py",
    "jobs/storage/rows.py",
    "jobs/storage/schema.py",
    "jobs/storage/logs.py",
    "jobs/storage/database.py",
    "/contextlib.py",
)
SUBMIT_FILES = (
    *STORE_FILES,
    "jobs/service.py",
    "jobs/experiments/sweep.py",
    "jobs/experiments/store.py",
)


@contextlib.contextmanager
def interrupt_at_line(n: int, files: tuple[str, ...]):
    """Raise KeyboardInterrupt at the n-th line run in `files`; yields a list that holds
    (lines counted, where it was raised or None)."""
    seen = [0, None]

    def tracer(frame, event, arg):
        name = frame.f_code.co_filename
        if not name.endswith(files):
            return None
        if name.endswith("/contextlib.py") and not frame.f_back.f_code.co_filename.endswith(files):
            return None  # a `with` of someone else's (this test's own)
        if event == "line":
            seen[0] += 1
            if seen[0] == n:
                seen[1] = f"{Path(name).name}:{frame.f_lineno}"
                raise KeyboardInterrupt
        return tracer

    previous = sys.gettrace()
    sys.settrace(tracer)
    try:
        yield seen
    finally:
        sys.settrace(previous)


def others_can_write(path: Path) -> bool:
    """Can another connection (another process's, in effect) take the write lock now?"""
    db = sqlite3.connect(path, timeout=0.5, isolation_level=None)
    try:
        db.execute("BEGIN IMMEDIATE")
        db.execute("ROLLBACK")
        return True
    except sqlite3.OperationalError:
        return False
    finally:
        db.close()


def new_record(n: int) -> JobRecord:
    return JobRecord(
        id=f"job-{n:04d}",
        name=f"interrupted-{n}",
        spec=JobSpec.from_options({"workers": 1}),
        state=JobState.QUEUED,
        created=time.time(),
        owner="alice",
        origin={"kind": "python"},
    )


@pytest.mark.slow
def test_ctrl_c_at_every_line_of_storing_a_job_leaves_it_whole_or_absent(tmp_path):
    store = JobStore(tmp_path / "store")
    jobs_dir = store.job_dir("x").parent
    interrupted = stored = 0
    n = 1
    while True:
        record = new_record(n)
        with interrupt_at_line(n, STORE_FILES) as seen:
            try:
                store.insert_job(record, b"payload", {"launch.json": b"{}"})
                finished = True
            except KeyboardInterrupt:
                finished = False
        if finished:
            break
        interrupted += 1
        where = seen[1]
        has_row = store.cancel_requested(record.id) is not None  # None: no such row
        has_dir = store.job_dir(record.id).is_dir()
        assert has_row == has_dir, (where, has_row, has_dir)
        if has_dir:
            stored += 1
            assert store.payload_path(record.id).read_bytes() == b"payload", where
        staging = [p.name for p in jobs_dir.iterdir() if p.name.startswith(STAGING_PREFIX)]
        assert staging == [], where
        assert others_can_write(store.database.path), f"the write lock is still held ({where})"
        n += 1
    # Afterwards the store takes jobs as ever (the interrupted connection is usable).
    store.insert_job(new_record(0), b"payload")
    assert store.get_job("job-0000").state == JobState.QUEUED
    assert interrupted > 20
    print(
        f"\n[faults] storing a job: {interrupted} interrupts (one per line), "
        f"{stored} left a whole job, {interrupted - stored} left nothing; half-written: 0"
    )


def test_ctrl_c_at_every_few_lines_of_submitting_a_sweep_cancels_what_it_stored(service, tmp_path):
    script = tmp_path / "slow.py"
    script.write_text("import time\ntime.sleep(120)\n")
    spec = JobSpec.from_options({"workers": 1, "framework": "none"})
    payload = Payload(kind="script", filename=str(script), argv=[])
    sweep = parse_sweep(["x=1,2"], parallel=1)
    # Every line would take minutes (each submit starts a supervisor); every STEP-th line
    # still lands in each part (checks, storing, each trial's submit, the cleanup).
    STEP = 9
    interrupted = made = 0
    n = 1
    while True:
        before = {r.id for r in service.store.list_jobs()[0]}
        with interrupt_at_line(n, SUBMIT_FILES) as seen:
            try:
                handle = submit_sweep(
                    service, spec, payload, sweep, origin={"kind": "cli"}, attach_to_pid=os.getpid()
                )
                finished = True
            except KeyboardInterrupt:
                finished = False
        if finished:
            handle.cancel()
            break
        interrupted += 1
        where = seen[1]
        new = [r for r in service.store.list_jobs()[0] if r.id not in before]
        made += len(new)
        for record in new:
            cancel = service.store.cancel_requested(record.id)
            assert cancel or str(record.state) == "cancelled", (where, record.id, record.state)
            assert service.store.job_dir(record.id).is_dir(), (where, record.id)
        assert others_can_write(service.store.database.path), f"write lock held ({where})"
        n += STEP
    for record in service.store.list_jobs()[0]:
        final = service.wait(record.id, timeout=90)
        assert str(final.state) == "cancelled", (final.name, final.reason, final.error)
    assert_no_job_processes(service)
    assert interrupted > 30
    print(
        f"\n[faults] submitting a 2-trial sweep: {interrupted} interrupts ({n - 1} lines run"
        f" in all), {made} trials stored, all cancelled; run on or failed: 0"
    )


def test_a_job_whose_submitter_ended_before_its_supervisor_started_is_cancelled(service):
    """The second line of defence: a submitter killed (not interrupted: no cleanup ran)
    between storing a job and starting its supervisor. The reaper settles the job as
    cancelled, as its attached submitter's end asks, not as failed; a job whose submitter
    still runs, or that no process is attached to, fails as never started."""
    import subprocess

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone_started = psutil.Process(gone.pid).create_time()
    gone.wait()
    old = time.time() - 2 * CLAIM_GRACE
    here = {"kind": "cli", "attach_host": this_host()}
    cases = {
        "submitter-gone": dict(here, attach_pid=gone.pid, attach_create_time=gone_started),
        "submitter-alive": dict(
            here, attach_pid=os.getpid(), attach_create_time=psutil.Process().create_time()
        ),
        "not-attached": {"kind": "python"},
        # Another host's pid means nothing here: its own reaper judges it.
        "elsewhere": dict(
            here, attach_host="elsewhere", attach_pid=gone.pid, attach_create_time=gone_started
        ),
    }
    for name, origin in cases.items():
        record = new_record(0)
        record.id, record.name, record.created, record.origin = f"j-{name}", name, old, origin
        service.store.insert_job(record, b"payload")
    service.reap(force=True)
    settled = {r.name: (str(r.state), r.reason) for r in service.store.list_jobs()[0]}
    assert settled["submitter-gone"] == (
        "cancelled",
        f"cancelled: its submitter (pid {gone.pid}) ended first",
    )
    for name in ("submitter-alive", "not-attached", "elsewhere"):
        assert settled[name] == ("failed", "the job's supervisor process never started"), name
