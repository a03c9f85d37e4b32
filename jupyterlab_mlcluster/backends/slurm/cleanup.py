"""What a dead supervisor left on Slurm, and the record by which the reaper finds it.

`pending_cleanup` in the job's backend_state is set before sbatch (so an allocation whose id
was never learned is still found, by the comment every allocation of ours carries), marked
when every rank exited on its own, and cleared once Slurm has let the allocation go; for a
job left with one, the reaper (SlurmBackend.cleanup_orphans) cancels what Slurm still runs.
"""

from __future__ import annotations

import logging
import os
import time
from typing import TYPE_CHECKING, Any

from . import script, watch
from .commands import SlurmCommands, SlurmError
from .watch import LOOK_BACKOFF

if TYPE_CHECKING:
    from ...jobs.storage.store import JobStore

log = logging.getLogger("jupyterlab_mlcluster.supervisor")

PENDING_CLEANUP = "pending_cleanup"
# After scancel, how long the supervisor waits for Slurm to let the job go before it says so
# and leaves the rest to the reaper (a pending cleanup stays recorded).
GONE_WAIT = 60.0
# A job whose ranks all exited: how long its allocation may take to end on its own before
# the reaper cancels it, and how often the reaper looks meanwhile.
ENDING_GRACE = GONE_WAIT
ENDING_LOOK = 2.0


def current_slurm_user() -> str:
    """The Unix user whose Slurm jobs these are (not $MLCLUSTER_USER: Slurm knows uids)."""
    import pwd

    return pwd.getpwuid(os.getuid()).pw_name


class PendingCleanup:
    """One job's Slurm fields of its backend_state: its Slurm job id and pending cleanup."""

    def __init__(self, store: JobStore, job_id: str):
        self.store = store
        self.job_id = job_id

    def submitting(self) -> None:
        """Recorded before sbatch: if this process dies before it learns the Slurm job id,
        the reaper still cancels the allocation (found by its comment)."""
        self._set(**{PENDING_CLEANUP: {"since": time.time()}})

    def submitted(self, slurm_id: str) -> None:
        self._set(slurm_job_id=slurm_id)

    def ranks_ended(self) -> None:
        """Every rank exited on its own: recorded before the job is final, so that the
        allocation's own end (the step's teardown, the ranks' interpreters exiting, an epilog)
        is never taken for a leftover by the reaper of any front end (cleanup_orphans waits
        for it, ENDING_GRACE at most, instead of cancelling the step of a job that
        succeeded)."""
        state = self.store.get_job(self.job_id).backend_state or {}
        pending = dict(state.get(PENDING_CLEANUP) or {"since": time.time()})
        pending["ended"] = time.time()
        self._set(**{PENDING_CLEANUP: pending})

    def done(self) -> None:
        """Slurm has let the allocation go: nothing is left for the reaper."""
        self._set(**{PENDING_CLEANUP: None})

    def reap(self, commands: SlurmCommands, poll_interval: float) -> None:
        """Cancel every allocation of the job Slurm still runs or queues (found by comment:
        also one whose id the supervisor never got to record); the cleanup stays pending,
        retried on the reaper's later passes with backoff, until Slurm has none left. A job
        whose ranks all exited (ranks_ended) is only watched ending, not cancelled, for
        ENDING_GRACE."""
        job_id = self.job_id
        state = dict(self.store.get_job(job_id).backend_state or {})
        pending = dict(state.get(PENDING_CLEANUP) or {"since": time.time()})
        if pending.get("next_attempt", 0) > time.time():
            return
        # Its ranks all exited: the allocation is ending on its own; it is only cancelled
        # if it outlives ENDING_GRACE (a task that never exits).
        ending = time.time() < float(pending.get("ended") or 0) + ENDING_GRACE
        try:
            rows = script.ours(self._user_jobs(commands, pending, poll_interval), job_id)
            active = [r["id"] for r in rows if r["state"] in script.ACTIVE_STATES]
            if active and not ending:
                commands.cancel(active)
                log.warning("job %s: cancelled its Slurm job(s) %s", job_id, ", ".join(active))
                rows = script.ours(commands.jobs(job_ids=active), job_id)
                active = [r["id"] for r in rows if r["state"] in script.ACTIVE_STATES]
            gone = not active
        except SlurmError as exc:
            log.warning("job %s: cannot cancel its Slurm allocation yet: %s", job_id, exc)
            gone = False
        if gone:
            state.pop(PENDING_CLEANUP, None)
        elif ending:
            pending["next_attempt"] = time.time() + ENDING_LOOK
        else:
            attempts = int(pending.get("attempts", 0)) + 1
            pending.update(
                attempts=attempts, next_attempt=time.time() + LOOK_BACKOFF.delay(attempts)
            )
            state[PENDING_CLEANUP] = pending
        self.store.update_job(job_id, backend_state=state)

    def _user_jobs(
        self, commands: SlurmCommands, pending: dict[str, Any], poll_interval: float
    ) -> list[dict[str, str]]:
        """The user's jobs as Slurm says them: the watcher's snapshot (watch.py) when it is
        fresh and was asked after the job's allocation was submitted, else squeue asked here
        (no supervisor follows a Slurm job: nobody watches)."""
        user = current_slurm_user()
        snapshot = watch.read_snapshot(watch.snapshot_path(self.store.root, user)) or {}
        asked = float(snapshot.get("asked_at") or 0)
        fresh = time.time() - asked < max(3 * poll_interval, 3.0)
        if fresh and asked > float(pending.get("since") or 0) and not snapshot.get("failures"):
            return list((snapshot.get("jobs") or {}).values())
        return commands.jobs(user=user)

    def _set(self, **fields: Any) -> None:
        """Set (None: drop) fields of the job's backend_state."""
        state = dict(self.store.get_job(self.job_id).backend_state or {})
        for key, value in fields.items():
            if value is None:
                state.pop(key, None)
            else:
                state[key] = value
        self.store.update_job(self.job_id, backend_state=state)
