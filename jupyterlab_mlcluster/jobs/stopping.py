"""Stopping a job, and forgetting one: a cancel request its supervisor reads, a signal to
that supervisor, the wait for the job to end, and a purge only once nothing of it runs."""

from __future__ import annotations

import json
import logging
import os
import signal
import time
from collections.abc import Callable

from ..config import MLClusterConfig
from .record import JobRecord
from .running.processes import heartbeat_age, holder_alive, process_is, this_host
from .sessions import is_session_cell, poke_session
from .storage.fsinfo import is_storage_full
from .storage.store import JobStore

log = logging.getLogger("jupyterlab_mlcluster.service")

# How long a purge waits for a final job's processes to exit before refusing.
PURGE_EXIT_WAIT = 5.0
# How long a stop waits past its ranks' grace before it kills a wedged supervisor.
STOP_SLACK = 10.0


class JobStillRunning(RuntimeError):
    """A purge refused: something of the job may still run (the message says what)."""


class JobStopper:
    """Stops the jobs of one store (`reap`: settle jobs whose supervisor died, `force`: now;
    `wait`: until a job is final or the timeout passes)."""

    def __init__(
        self,
        store: JobStore,
        config: MLClusterConfig,
        reap: Callable[[bool], list[str]],
        wait: Callable[[str, float | None], JobRecord],
    ):
        self.store = store
        self.config = config
        self.reap = reap
        self.wait = wait

    def cancel(
        self, job_id: str, *, purge: bool = False, wait: bool = True, by: str | None = None
    ) -> JobRecord | None:
        """Stop a job (all ranks); with `purge`, also forget it (rows, logs, files).
        `by`: who or what asked ("Ctrl-C of mlcluster run"); the job's reason names it."""
        record = self.store.get_job(job_id)
        if not record.final:
            try:
                self.store.request_cancel(job_id, f"cancelled by {by or 'user'}")
            except Exception as exc:
                # A full disk: the request cannot be written, but the supervisor's SIGTERM
                # below is the same request (it stops the ranks, and writes the end with
                # the store's reserve).
                if not is_storage_full(exc, self.store.root):
                    raise
                log.warning("cannot record the cancel of job %s (%s): signalling it", job_id, exc)
            self.signal_supervisor(record, signal.SIGTERM)
            self.reap(True)
            if wait or purge:
                # The job's own grace (its --grace, or its submitter's setting), then some.
                grace = self.job_grace(job_id) + STOP_SLACK
                record = self.wait(job_id, grace)
                if not record.final:
                    # A wedged supervisor: kill it; its ranks die with it; then reap.
                    self.signal_supervisor(record, signal.SIGKILL)
                    time.sleep(0.2)
                    self.reap(True)
                    record = self.wait(job_id, 5.0)
        if purge:
            # A supervisor that has just made its job final is still exiting: give it (and
            # anything of the job) a moment to be gone. A job not final by now stays so.
            deadline = time.monotonic() + PURGE_EXIT_WAIT
            while True:
                record = self.store.get_job(job_id)
                alive = self.still_running(record)
                if not alive or not record.final or time.monotonic() > deadline:
                    break
                time.sleep(0.05)
            if alive:
                raise JobStillRunning(f"job {job_id} was not purged: {alive}")
            from .tracking.mlflow_run import purge_local_run

            purge_local_run(self.store.root, record.tracking)
            self.store.delete_job(job_id)
            return None
        return self.store.get_job(job_id)

    def job_grace(self, job_id: str) -> float:
        """The seconds the job's ranks get between SIGTERM and SIGKILL: what its submitter
        settled (--grace or its setting), else this process's setting."""
        try:
            launch = json.loads((self.store.job_dir(job_id) / "launch.json").read_bytes())
            return float(launch["config"]["kill_grace_period"])
        except (OSError, ValueError, KeyError, TypeError):
            return self.config.kill_grace_period

    def still_running(self, record: JobRecord) -> str | None:
        """What of the job may still run (None: nothing): on this host its supervisor or a
        rank, the very processes; on another host, a supervisor whose heartbeat is fresh
        while the job is not final (a supervisor makes its job final only once its ranks
        are stopped). Purging such a job would forget processes that still run."""
        if record.final and is_session_cell(record):
            return None  # the session's supervisor and ranks serve other cells: not this one
        sup = record.supervisor or {}
        if sup.get("fleet") and record.final:
            return None  # its fleet lives on for other jobs; this one's supervision ended
        if sup.get("host", this_host()) == this_host():
            if process_is(sup.get("pid"), sup.get("create_time")):
                return f"its supervisor (pid {sup['pid']}) is still running"
            for rank, pid, started in self.store.rank_processes(record.id):
                if process_is(pid, started):
                    return f"its rank {rank} (pid {pid}) is still running"
            return None
        if not record.final and holder_alive(sup, record.heartbeat):
            return (
                f"its supervisor on host {sup.get('host')!r} is alive (heartbeat"
                f" {heartbeat_age(record.heartbeat):.0f} s ago) and has not ended it yet"
            )
        return None

    def signal_supervisor(self, record: JobRecord, signum: int) -> None:
        if is_session_cell(record):
            # Its supervisor is the session's: a signal would end the session. Woken instead,
            # it reads the cell's cancel request and interrupts the cell on every rank.
            poke_session(self.store, record.origin["session_job"], "cancel")
            return
        info = record.supervisor or {}
        if info.get("fleet"):
            # A fleet supervises many jobs (running/fleet.py): a signal would end it. It
            # reads the stored cancel request as soon as it is written.
            return
        if info.get("host") == this_host() and process_is(info.get("pid"), info.get("create_time")):
            try:
                os.kill(info["pid"], signum)
            except OSError:
                pass
