"""One cell running in a session, whichever backend's ranks run it (jobs/sessions.py).

The session's supervisor (backends/local/session.py: ranks on this machine;
backends/kubernetes/session.py: ranks in pods) delivers the cell to its ranks and hears back
from each; what that news means for the cell's job record is the same on every backend and
lives here: each rank's `cell_done` (ok, error, interrupted), when the others must be
interrupted (a rank failed), when the cell must be stopped (its cancel, its timeout), and
how it finishes: succeeded with rank 0's result, failed with the failing rank's report (or
a reason the supervisor gives: the session died, the result was refused), cancelled; the
ranks that never reported are cancelled, and the cell's followers are woken at once.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING

from . import lifecycle
from .lifecycle import Outcome, OutcomeKind
from .model import JobState, RankState
from .storage.watch import ENDED

if TYPE_CHECKING:
    from .running.supervisor import JobContext
    from .storage.store import JobStore


class SessionCell:
    def __init__(self, ctx: JobContext):
        self.ctx = ctx
        self.id = ctx.job.id
        self.started = time.monotonic()
        self.done: dict[int, str] = {}  # rank -> ok | error | interrupted
        self.failed_rank: int | None = None
        self.interrupted_at: float | None = None
        self.stop: tuple[str, str] | None = None  # ("cancelled" | "timeout", why)

    def rank_done(self, rank: int, status: str) -> bool:
        """Rank `rank` reported the cell done; True when the others must be interrupted
        now (it failed, or was interrupted without being asked to)."""
        self.done[rank] = status
        state = {"ok": RankState.SUCCEEDED, "error": RankState.FAILED}.get(
            status, RankState.CANCELLED
        )
        self.ctx.set_ranks({rank: {"state": state, "finished": time.time()}})
        asked = self.interrupted_at is not None
        if status == "error" or (status == "interrupted" and not asked):
            if self.failed_rank is None:
                self.failed_rank = rank
            return not asked
        return False

    def interrupting(self, why: str) -> None:
        """The supervisor interrupts the cell on every rank now (and says why)."""
        self.interrupted_at = time.monotonic()
        self.ctx.logs.system(f"[mlcluster] {why}: interrupting the cell on every rank")

    def stop_reason(self) -> str | None:
        """Why the cell must be interrupted now (its cancel, its timeout), once; None."""
        self.ctx.tick()
        if self.interrupted_at is not None:
            return None
        reason = self.ctx.cancelled()
        timeout = self.ctx.job.spec.timeout
        if reason:
            self.stop = ("cancelled", reason)
            return reason
        if timeout and time.monotonic() - self.started > timeout:
            self.stop = ("timeout", f"timed out after {lifecycle.format_duration(timeout)}")
            return self.stop[1]
        return None

    def past_grace(self, grace: float) -> bool:
        """Interrupted longer ago than `grace` (a rank stuck, in a collective say)."""
        return self.interrupted_at is not None and time.monotonic() - self.interrupted_at > grace

    def stuck_text(self, ranks: Iterable[int], grace: float) -> str:
        stuck = [str(r) for r in ranks if r not in self.done]
        return (
            f"rank {', '.join(stuck)} did not return within {grace:g} s of the interrupt:"
            " the session was restarted and its state was lost"
        )

    def finish(
        self,
        store: JobStore,
        ranks: Iterable[int],
        *,
        lost: str | None = None,
        failed: tuple[int | None, str] | None = None,
        refused: str | None = None,
    ) -> None:
        """The cell's final state. `lost`: the session ended or restarted under it (said);
        `failed`: (rank, why) the supervisor saw (a rank died); `refused`: why rank 0's
        result was dropped (it fails the cell)."""
        ctx = self.ctx
        now = time.time()
        ctx.set_ranks(
            {
                r: {"state": RankState.CANCELLED, "finished": now}
                for r in ranks
                if r not in self.done
            }
        )
        suffix = f"; {lost}" if lost else ""
        if lost:
            ctx.logs.system(f"[mlcluster] {lost}")
        if failed is not None:
            ctx.set_state(JobState.FAILED, error=failed[1], failed_rank=failed[0], reason=None)
        elif self.failed_rank is not None:
            outcome = Outcome(
                OutcomeKind.FAILED,
                None
                if self.done.get(self.failed_rank) == "error"
                else f"rank {self.failed_rank} was interrupted (KeyboardInterrupt)",
                failed_rank=self.failed_rank,
            )
            error = lifecycle.failure_text(store, self.id, outcome) + suffix
            ctx.set_state(JobState.FAILED, error=error, failed_rank=self.failed_rank, reason=lost)
        elif self.stop is not None:
            kind, why = self.stop
            state = JobState.CANCELLED if kind == "cancelled" else JobState.FAILED
            fields = {"reason": why + suffix}
            if state == JobState.FAILED:
                fields["error"] = why + suffix
            ctx.set_state(state, **fields)
        elif refused:
            ctx.set_state(JobState.FAILED, error=refused, failed_rank=0, reason=None)
        else:
            has_result = store.result_path(self.id).exists()
            ctx.set_state(JobState.SUCCEEDED, has_result=has_result, reason=None)
        with contextlib.suppress(OSError):
            ctx.logs.close()
        mark_ended(store, self.id)


def mark_ended(store: JobStore, job_id: str) -> None:
    """Wake the cell's followers (the kernel's monitor) at once, as a job's supervisor does."""
    with contextlib.suppress(OSError):
        (store.job_dir(job_id) / ENDED).touch()
