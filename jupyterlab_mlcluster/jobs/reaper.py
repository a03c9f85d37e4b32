"""The reaper: jobs whose supervisor died are settled, so nothing stays `running` forever.

Every JobService reaps on its way (listing, waiting, following: at most once a second unless
forced), and a dead local supervisor's sentinel execs `python -m jupyterlab_mlcluster.jobs.
settle`, which reaps at once. A job whose supervisor is gone is respawned where its backend
says it lives on (SupervisorLost.RESPAWN: a cluster's job), else finished: cancelled when
that was asked (or its submitter died before its supervisor started), failed saying the
supervisor was lost otherwise; a session's cell whose session ended fails saying its state
is lost. Final jobs whose backend could not clean up yet are cleaned when it is due. A full
disk defers what cannot be written to a later reap, said once per job.
"""

from __future__ import annotations

import logging
import sqlite3
import time
from typing import TYPE_CHECKING

from .backend import SupervisorLost
from .model import JobState, RankState
from .running.processes import submitter_gone, supervisor_alive, supervisor_lost_reason
from .sessions import ended_cell_error
from .storage.fsinfo import is_storage_full
from .storage.store import JobStore, UnknownJob

if TYPE_CHECKING:
    from .service import JobService

log = logging.getLogger("jupyterlab_mlcluster.service")

FLEET_NUDGE_AFTER = 5.0


class Reaper:
    """One JobService's reaper (its store, its backends, its way to start a supervisor)."""

    def __init__(self, service: JobService):
        self.service = service
        self._last_reap = 0.0
        self._last_staging_sweep = float("-inf")
        self._unsettled: dict[str, int] = {}  # job id -> reaps that could not write (full disk)
        self._uncleaned: dict[str, int] = {}  # the same, for a final job's pending cleanup
        self._unrespawned = 0  # reaps that could not hand orphans to new supervisors (full)
        self._nudged: dict[str, float] = {}  # unclaimed job -> when its fleet was last ensured

    def _nudge_fleet(self, row: sqlite3.Row) -> None:
        """A job no supervisor has claimed for FLEET_NUDGE_AFTER: if a fleet supervises it,
        make sure that fleet runs (it adopts the job). One that was exiting when the job was
        handed over, or that died before it could claim, costs seconds, not the claim grace."""
        now = time.time()
        if now - row["created"] < FLEET_NUDGE_AFTER:
            return
        if now - self._nudged.get(row["id"], 0.0) < FLEET_NUDGE_AFTER:
            return
        self._nudged = {k: v for k, v in self._nudged.items() if now - v < 60.0}
        self._nudged[row["id"]] = now
        try:
            self.service.starter.hand_to_fleet(row["id"])
        except Exception as exc:  # noqa: BLE001 - the claim grace settles it at worst
            log.debug("could not ensure the fleet of job %s: %s", row["id"], exc)

    @property
    def store(self) -> JobStore:
        return self.service.store

    def reap(self, force: bool = False) -> list[str]:
        """Settle jobs whose supervisor died: nothing may stay `running` forever."""
        now = time.monotonic()
        if not force and now - self._last_reap < 1.0:
            return []
        self._last_reap = now
        reaped = []
        respawn: dict[str, str | None] = {}  # orphans to hand to a new supervisor: their claims
        unfinished = self.store.unfinished_jobs()
        for row in unfinished:
            if row["session_job"] and self._settle_session_cell(row):
                reaped.append(row["id"])
                continue
            # A cancelled job no supervisor has claimed yet is settled now, not after the
            # claim grace: one that starts later finds it final and exits (claim_supervisor).
            unclaimed_cancel = row["cancel_requested"] and not row["supervisor"]
            if supervisor_alive(row) and not unclaimed_cancel:
                if not row["supervisor"]:
                    self._nudge_fleet(row)
                continue
            try:
                if self._settle_orphan(row, respawn):
                    reaped.append(row["id"])
                tries = self._unsettled.pop(row["id"], 0)
                if tries:
                    log.warning("job %s settled after %d tries (a full disk)", row["id"], tries)
            except Exception as exc:
                if not self._later_when_full(exc, self._unsettled, row["id"], "settle"):
                    raise
        self._respawn(respawn)
        # Final jobs whose backend could not clean up yet (e.g. the Kubernetes API server was
        # unreachable): the backend tries again when its own backoff says it is due.
        pending = self.store.pending_cleanups()
        # A job's refused cleanups are forgotten once it has none pending (not when a call
        # returns: the backend may not have been due), so a long full disk is said once per
        # job, and the map holds only jobs still pending.
        still = set(pending)
        self._uncleaned = {k: v for k, v in self._uncleaned.items() if k in still}
        for job_id in pending:
            record = self.store.get_job(job_id)
            if record.final:
                try:
                    self.service.backend(record.backend).cleanup_orphans(self.store, record)
                except Exception as exc:
                    if not self._later_when_full(exc, self._uncleaned, job_id, "clean up"):
                        raise
        if not self.store.database.read_only and now - self._last_staging_sweep > 60.0:
            self._last_staging_sweep = now  # a directory scan: not on every reap
            self.store.remove_stale_staging()
        return reaped

    def _respawn(self, held: dict[str, str | None]) -> None:
        """Hand each orphan of `held` (id -> its dead supervisor's claim as read) to a new
        supervisor: the claims forgotten in one transaction, only those still the dead
        one's (a fleet started for an earlier row may have adopted some already: their claim
        stands). A fleet killed with its thousand jobs costs one write here, not a thousand,
        and its jobs reach the next fleet together."""
        if not held:
            return
        try:
            forgotten = self.store.fleet.forget_holders(held)
        except Exception as exc:
            if not is_storage_full(exc, self.store.root):
                raise
            self._unrespawned += 1
            if self._unrespawned == 1:  # (said once, not every reap)
                log.warning("cannot hand %d jobs to new supervisors yet: %s", len(held), exc)
            return
        if self._unrespawned:
            log.warning("jobs handed to new supervisors after %d tries", self._unrespawned)
            self._unrespawned = 0
        for job_id in held:
            if job_id in forgotten:
                self.service.starter.start(job_id)

    def _later_when_full(
        self, exc: Exception, tries: dict[str, int], job_id: str, what: str
    ) -> bool:
        """True when `exc` is the store's disk being full: `what` is done for the job by a
        later reap once there is space, and a listing that reaps on the way must not fail
        for it. Said once per job, not on every reap (a server reaps every few seconds);
        `tries` counts the refused reaps until the caller's success forgets the job."""
        if not is_storage_full(exc, self.store.root):
            return False
        count = tries[job_id] = tries.get(job_id, 0) + 1
        if count == 1:
            log.warning("cannot %s job %s yet: %s", what, job_id, exc)
        return True

    def _settle_session_cell(self, row: sqlite3.Row) -> bool:
        """A session's cell whose session has ended (its supervisor killed before it could
        end its cells, say) fails now, saying so, not after the claim grace. True if so."""
        try:
            session = self.store.get_job(row["session_job"])
        except UnknownJob:
            session = None
        if session is not None and not session.final:
            return False
        why = ended_cell_error(session)
        moved = self.store.transition(row["id"], JobState.FAILED, error=why, reason=why)
        self.store.update_ranks(
            row["id"],
            {
                r.rank: {"state": RankState.CANCELLED, "finished": time.time()}
                for r in self.store.get_job(row["id"]).ranks
                if not r.state.final
            },
        )
        return moved

    def _settle_orphan(self, row: sqlite3.Row, respawn: dict[str, str | None]) -> bool:
        """A job whose supervisor is gone: put it in `respawn` (a backend may ask for a new
        supervisor) or finish the job; True if it was finished here."""
        record = self.store.get_job(row["id"])
        backend = self.service.backend(record.backend)
        if (
            not row["cancel_requested"]
            and backend.supervisor_lost(self.store, record) == SupervisorLost.RESPAWN
        ):
            respawn[record.id] = row["supervisor"]
            return False
        backend.cleanup_orphans(self.store, record)
        if row["cancel_requested"]:
            asked = record.reason or ""  # who asked (request_cancel), else the user
            why = asked if asked.startswith("cancelled") else "cancelled by user"
            moved = self.store.transition(record.id, JobState.CANCELLED, reason=why)
        elif not row["supervisor"] and submitter_gone(record.origin):
            # Its submitter (a CLI stopped by Ctrl-C mid-submit) ended before the job's
            # supervisor started: the job would have been cancelled with it.
            why = f"cancelled: its submitter (pid {record.origin['attach_pid']}) ended first"
            moved = self.store.transition(record.id, JobState.CANCELLED, reason=why)
        else:
            why = supervisor_lost_reason(row)
            moved = self.store.transition(record.id, JobState.FAILED, error=why, reason=why)
        self.store.update_ranks(
            record.id,
            {
                r.rank: {"state": RankState.CANCELLED, "finished": time.time()}
                for r in record.ranks
                if not r.state.final
            },
        )
        return moved
