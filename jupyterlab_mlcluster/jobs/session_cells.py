"""A session's cells, whichever backend's ranks run them (jobs/sessions.py): the ones
waiting (`SessionInbox`) and the one running (`SessionCell`).

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

import collections
import contextlib
import os
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING

from .. import patterns
from . import lifecycle
from .lifecycle import Outcome, OutcomeKind
from .model import JobState, RankState
from .sessions import FIFO_NAME
from .storage.store import UnknownJob
from .storage.watch import ENDED

if TYPE_CHECKING:
    from .running.supervisor import JobContext
    from .storage.series import SeriesWriter
    from .storage.store import JobStore

SCAN_INTERVAL = 1.0  # the store scan behind the FIFO's wake-ups
MAX_PENDING = 256  # wake-ups queued at most (a flood of them is dropped)


def series_now(cell: SessionCell | None, session: JobContext) -> SeriesWriter:
    """Where a session rank's logged points (`mlc.log`, on its progress report) go: the
    running cell's job, whose monitor and GET /jobs/{cell}/metrics show them; between cells,
    the session's own. (A rank sends its last points before its `cell_done`.)"""
    return (cell.ctx if cell is not None else session).series


class SessionCell:
    def __init__(self, ctx: JobContext):
        self.ctx = ctx
        self.id = ctx.job.id
        self.started = time.monotonic()
        self.done: dict[int, str] = {}  # rank -> ok | error | interrupted
        self.failed_rank: int | None = None
        self.interrupted_at: float | None = None
        self.stop: tuple[str, str] | None = None  # ("cancelled" | "timeout", why)
        self.result_refused: str | None = None  # why rank 0's result was dropped (fails it)

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


class SessionInbox:
    """The cells waiting for a session's supervisor, across the session's incarnations:
    woken by one line in the FIFO in the holder's job directory (sessions.poke_session: a
    hint, checked against the store), backed by a scan of the store every SCAN_INTERVAL;
    a restart request; the cells run and the idle clock; at the end, no cell left waiting."""

    def __init__(self, ctx: JobContext):
        self.ctx = ctx
        self.store = ctx.store
        self.holder = ctx.job
        self.pending: collections.deque[str] = collections.deque()
        self.restart_requested = False
        self.last_activity = time.monotonic()
        self.last_scan = 0.0
        row = self.store.session_row(self.holder.id) or {}
        self.cells = int(row.get("cells") or 0)
        path = self.store.job_dir(self.holder.id) / FIFO_NAME
        with contextlib.suppress(FileNotFoundError):
            path.unlink()  # a previous supervisor's (this one respawned)
        os.mkfifo(path, 0o600)
        # Read-write: the FIFO never reads as closed between writers.
        self.fifo = os.open(path, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
        self.fifo_path = path
        self.fifo_buffer = b""

    def close(self) -> None:
        os.close(self.fifo)
        with contextlib.suppress(OSError):
            self.fifo_path.unlink()

    # -- news --------------------------------------------------------------------------

    def read_fifo(self) -> None:
        while True:
            try:
                data = os.read(self.fifo, 65536)
            except BlockingIOError:
                break
            if not data:
                break
            self.fifo_buffer += data
        *lines, self.fifo_buffer = self.fifo_buffer.split(b"\n")
        self.fifo_buffer = self.fifo_buffer[-4096:]
        for line in lines:
            what, _, arg = line.decode("utf-8", "replace").partition(" ")
            if what == "cell":
                self.add_pending(arg.strip())
            elif what == "restart":
                self.scan(force=True)
            # "cancel": the loop polls the running cell's cancel flag below

    def add_pending(self, cell_id: str, current: str | None = None) -> None:
        # A wake-up is a hint (the store scan finds every waiting cell anyway): one that
        # is no job id, or past MAX_PENDING, is dropped, so a flood of them neither grows
        # this queue nor delays a real cell behind it.
        if (
            patterns.matches(patterns.JOB_ID, cell_id)
            and cell_id != current
            and len(self.pending) < MAX_PENDING
            and cell_id not in self.pending
        ):
            self.pending.append(cell_id)

    def scan(self, current: str | None = None, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self.last_scan < SCAN_INTERVAL:
            return
        self.last_scan = now
        for cell_id in self.store.session_cells(self.holder.id, [str(JobState.STARTING)]):
            self.add_pending(cell_id, current)
        row = self.store.session_row(self.holder.id) or {}
        if row.get("restart_requested"):
            self.restart_requested = True

    def end_waiting_cells(self, why: str | None = None) -> None:
        """No cell of an ended session stays waiting or running."""
        why = why or f"the session ended: {self.ctx.job.reason or self.ctx.job.error or 'stopped'}"
        for cell_id in self.store.session_cells(
            self.holder.id, [str(JobState.STARTING), str(JobState.RUNNING)]
        ):
            with contextlib.suppress(UnknownJob):
                self.store.transition(cell_id, JobState.FAILED, error=why, reason=why)
                mark_ended(self.store, cell_id)
        self.pending.clear()
