"""`python -m jupyterlab_mlcluster.jobs.settle STORE_DIR JOB_ID`: what a dead local
supervisor's sentinel execs (running/proctree.py's Sentinel, from backends/local) once it
has killed what the job's ranks left: the job is settled at once, as any reaper would
(jobs/reaper.py), with the settings it was submitted with.

A program of its own, in a fresh interpreter (SQLite's locks do not survive the sentinel's
fork); the supervisor imports nothing of it, so the reaper's service stays above the
processes it reaps.
"""

from __future__ import annotations

import sys
from pathlib import Path

from .running.supervisor import launch_settings, submitter_config
from .service import JobService
from .storage.store import JobStore


def settle_after_death(root: Path, job_id: str) -> int:
    config = submitter_config(root, job_id)
    mode = launch_settings(root, job_id).get("store_journal_mode") or config.store_journal_mode
    JobService(config, JobStore(root, journal_mode=mode)).reap(force=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print("usage: python -m jupyterlab_mlcluster.jobs.settle STORE_DIR JOB_ID", file=sys.stderr)
        return 2
    return settle_after_death(Path(argv[0]), argv[1])


if __name__ == "__main__":
    # A program of its own: like a front end, its entry fills the backend registry (the
    # reaper asks a job's backend what to do). Allowed by name in pyproject.toml's contracts.
    from .. import backends  # noqa: F401

    sys.exit(main())
