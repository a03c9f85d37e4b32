"""A Slurm job's end: a job that succeeded keeps its allocation's own end (issue 30, item 6).

A job is final once its ranks have exited; its allocation may still show in squeue a moment
longer (the step's teardown, the ranks' interpreters exiting, the node's epilog). The test
cluster's epilog holds it there for as long as a test asks, so the reaper meets it every time. Nothing may then mistake it
for a dead supervisor's leftover and cancel it: not the next job's reaper, not the reaper of
any front end.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import time
from pathlib import Path

from helpers import run_cli, wait_for

from jupyterlab_mlcluster.backends.slurm import script as slurm_script
from jupyterlab_mlcluster.jobs.model import JobSpec, JobState
from jupyterlab_mlcluster.runtime.payload import Payload


def slurm_state(slurm, slurm_id: str) -> str:
    """The Slurm job's state as squeue says it (MinJobAge keeps ended jobs 30 s)."""
    out = slurm.run("squeue", "--noheader", "--states=all", f"--jobs={slurm_id}", "--format=%T")
    return out.stdout.strip()


def rank_errors(store_dir: Path, job_id: str) -> str:
    attempt = store_dir / "jobs" / job_id / "slurm" / "attempt-0"
    return "".join(p.read_text(errors="replace") for p in sorted(attempt.glob("rank-*.err")))


def test_a_succeeded_jobs_lingering_allocation_is_not_cancelled_by_the_reaper(
    slurm_store, slurm, caplog
):
    from jupyterlab_mlcluster.jobs.service import JobService

    service = JobService()
    spec = JobSpec.from_options({"backend": "slurm", "workers": 2})
    with slurm.ending_held():
        job = service.submit(spec, Payload(source="print('done', flush=True)\n"))
        record = service.wait(job.id, timeout=120)
        assert record.state == JobState.SUCCEEDED, record.error
        slurm_id = record.backend_state["slurm_job_id"]
        # Every front end reaps on its way (the next job's CLI, a listing): as often as it
        # may, while the allocation is still ending.
        with caplog.at_level(logging.WARNING):
            for _ in range(20):
                assert slurm_state(slurm, slurm_id) in slurm_script.ACTIVE_STATES
                assert service.reap(force=True) is not None
                time.sleep(0.05)
    with caplog.at_level(logging.WARNING):
        wait_for(
            lambda: (
                service.reap(force=True) is not None
                and slurm_state(slurm, slurm_id) not in slurm_script.ACTIVE_STATES
            ),
            60,
            interval=0.05,
            message="the allocation to end",
        )
    assert slurm_state(slurm, slurm_id) == "COMPLETED"
    assert not [r.message for r in caplog.records if "cancelled its Slurm job" in r.message]
    assert "CANCELLED" not in rank_errors(slurm_store, job.id)
    # Its end is recorded: once Slurm has let it go, nothing is left pending for it.
    wait_for(
        lambda: (
            service.reap(force=True) is not None
            and "pending_cleanup" not in service.get(job.id).backend_state
        ),
        30,
        message="the pending cleanup to be cleared",
    )
    lines = [line["line"] for line in service.logs(job.id)[0]]
    assert lines.count("done") == 2 and not [line for line in lines if "CANCELLED" in line]


def test_back_to_back_cli_runs_leave_each_others_allocations_alone(slurm_store, slurm, tmp_path):
    """The user's way: `mlcluster run` three times, each started while the one before runs,
    so each waits in Slurm's queue for the node (2 CPUs) and reaps while it waits, as the run
    before it ends; nothing cancels an allocation of the run before."""
    script = tmp_path / "hello.py"
    script.write_text("import time\ntime.sleep(2)\nprint('done', flush=True)\n")
    argv = [sys.executable, "-m", "jupyterlab_mlcluster.cli", "run", "--backend", "slurm"]
    runs = []
    for _ in range(3):
        runs.append(
            subprocess.Popen(
                [*argv, "--workers", "2", str(script)],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
        time.sleep(0.5)  # (only their order: each has the node after the one before)
    outputs = [run.communicate(timeout=180)[0] for run in runs]
    assert [run.returncode for run in runs] == [0, 0, 0], outputs
    listing = run_cli("jobs")  # one more reap, as the last run's allocation ends
    outputs.append(listing.stdout + listing.stderr)
    slurm.wait_empty(60)
    assert not [out for out in outputs if "cancelled its Slurm job" in out], outputs
    from jupyterlab_mlcluster.jobs.service import JobService

    records = JobService().store.list_jobs()[0]
    assert len(records) == 3 and all(r.state == JobState.SUCCEEDED for r in records)
    out = slurm.run("squeue", "--noheader", "--states=all", "--format=%k %T").stdout
    states = dict(line.split() for line in out.splitlines() if line.startswith("mlcluster:"))
    for job_id in (r.id for r in records):
        assert states.get(f"mlcluster:{job_id}") == "COMPLETED", (job_id, out)
        assert "CANCELLED" not in rank_errors(slurm_store, job_id)
