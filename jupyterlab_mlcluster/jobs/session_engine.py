"""The one loop that serves a session's cells, whichever backend's ranks run them.

A session's supervisor (jobs/sessions.py) builds a `SessionEngine` and hands it, for each
incarnation of the session's ranks, a `SessionTransport`: the backend's few verbs (the
ranks started, a cell sent to them, an interrupt, whether they live, their stop). The
engine owns everything else, in one order on every backend:

- admission: a cell (found by the FIFO or the store scan: session_cells.SessionInbox) runs
  only if it is a waiting cell of this session and its owner's;
- claim, then send: the cell is claimed in the store before any rank sees it; a cell that
  cannot be claimed is never run, and never dropped without a word: one settled meanwhile
  keeps its final state, any other fails saying why;
- interrupt and advance: each rank's `cell_done`; a failing rank interrupts the others,
  the cell's cancel or timeout interrupts them all, ranks stuck past
  `session_interrupt_grace` restart the session;
- finish: the session's count and idle clock before the cell's end;
- the session's end: stopped, idle for `session_idle_timeout` (counted once the ranks can
  take a cell), a dead rank, or a restart (a new incarnation, the cell says its state was
  lost).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from . import lifecycle
from .lifecycle import Outcome, OutcomeKind
from .model import JobState, RankState
from .session_cells import SessionCell, SessionInbox, mark_ended
from .storage.store import UnknownJob

if TYPE_CHECKING:
    from .record import JobRecord
    from .running.supervisor import JobContext

RESTART = OutcomeKind.RESTART
LOOP_TICK = 0.05  # the longest a transport waits for news


class SessionTransport(Protocol):
    """One incarnation of a session's ranks, as a backend runs them."""

    @property
    def rank_numbers(self) -> Sequence[int]: ...

    def await_news(self, timeout: float) -> None:
        """Wait at most `timeout` for news (output, reports: `SessionEngine.rank_done`)."""

    def dead(self) -> tuple[int | None, str] | None:
        """(rank, what to say) once a rank died or the ranks' allocation ended; the
        transport has recorded it and stopped the rest."""

    def ready(self) -> bool:
        """Every rank can take a cell now."""

    def new_cell(self, ctx: JobContext) -> SessionCell: ...

    def send_cell(self, cell_id: str) -> str | None:
        """Deliver the claimed cell to every rank; an error (the cell fails with it)."""

    def interrupt(self, cell_id: str, ranks: list[int]) -> None: ...

    def rank_host(self, rank: int) -> str | None: ...

    def settle_output(self) -> None:
        """Every rank reported the cell done: what they wrote before is in its logs."""

    def kill(self) -> None:
        """Ranks stuck past the interrupt's grace: stopped now (a restart follows)."""

    def shut_down(self) -> None:
        """The session ends or restarts: each rank asked to end as an interpreter does."""

    def flush_ranks(self) -> None:
        """The ranks' states as they stand, to the store now."""

    def cell_ended(self) -> None:
        """A cell is over (and the ranks' states as they stand are in the store)."""

    def flush(self) -> None: ...


class SessionEngine:
    """A session across its incarnations: its inbox, the running cell, the idle clock."""

    def __init__(self, ctx: JobContext, restarted_text: str = "fresh ranks, state lost"):
        self.ctx = ctx
        self.store = ctx.store
        self.inbox = SessionInbox(ctx)  # the FIFO, the waiting cells, the counts
        self.cell: SessionCell | None = None
        self.transport: SessionTransport | None = None
        self.restarted_text = restarted_text
        self.ready_seen = False

    # -- across incarnations -------------------------------------------------------------

    def run(self, incarnation: Callable[[int], Outcome]) -> None:
        """Serve the session: `incarnation(number)` starts ranks, calls `serve` with its
        transport, stops them, and returns how that incarnation ended."""
        ctx = self.ctx
        number = ctx.job.restarts
        try:
            while True:
                outcome = incarnation(number)
                if outcome.kind != RESTART:
                    break
                number += 1
                self.store.update_job(ctx.job.id, restarts=number)
                ctx.job.restarts = number
                ctx.logs.system(f"[mlcluster] session restarted: {self.restarted_text}")
                ctx.set_all_ranks(
                    state=RankState.PENDING, exit_code=None, host=None, started=None, finished=None
                )
            self.settle(outcome)
        finally:
            self.inbox.close()
            self.inbox.end_waiting_cells()

    def settle(self, outcome: Outcome) -> None:
        """The session's end: the cells still waiting fail first, so whoever sees the
        session ended (stop returns then) finds none of its cells waiting for it."""
        ctx = self.ctx
        if ctx.job.state.final:
            return  # said when it ended (a dead rank: before the cell's failure)
        if outcome.kind == OutcomeKind.SUCCEEDED:  # idle
            self.inbox.end_waiting_cells(f"the session ended: {outcome.message}")
            ctx.set_state(JobState.SUCCEEDED, reason=outcome.message)
        elif outcome.kind == OutcomeKind.CANCELLED:
            reason = outcome.message or "stopped"
            if reason.startswith("cancelled by user"):  # (who asked follows, if said)
                reason = "stopped by user" + reason[len("cancelled by user") :]
            self.inbox.end_waiting_cells(f"the session ended: {reason}")
            ctx.set_state(JobState.CANCELLED, reason=reason)
        else:
            self.inbox.end_waiting_cells(f"the session ended: {outcome.message}")
            lifecycle.finish(ctx, outcome)

    # -- one incarnation -----------------------------------------------------------------

    def serve(self, transport: SessionTransport) -> Outcome:
        """Serve cells on `transport`'s ranks until the session ends or must restart."""
        ctx, inbox, t = self.ctx, self.inbox, transport
        self.transport, self.cell, self.ready_seen = t, None, False
        inbox.scan(force=True)
        while True:
            t.await_news(LOOP_TICK)
            died = t.dead()
            if died is not None:
                return self.died(*died)
            reason = ctx.cancelled()
            if reason:
                self.end_cell_now(f"the session was stopped ({reason})")
                t.shut_down()
                return Outcome(OutcomeKind.CANCELLED, reason)
            inbox.read_fifo()
            inbox.scan(self.cell.id if self.cell else None)
            if inbox.restart_requested:
                inbox.restart_requested = False
                self.store.update_session(ctx.job.id, restart_requested=0)
                self.end_cell_now("the session was restarted: its state is lost")
                t.shut_down()
                return Outcome(RESTART)
            if self.cell is not None:
                if self.advance() == RESTART:
                    return Outcome(RESTART)
            elif inbox.pending and t.ready():
                # Past ids that name no waiting cell of this session at once, to a real one.
                while inbox.pending and not self.begin(inbox.pending.popleft()):
                    pass
            elif self.idle_expired():
                idle = lifecycle.format_duration(ctx.config.session_idle_timeout)
                t.shut_down()
                return Outcome(
                    OutcomeKind.SUCCEEDED,
                    f"ended after {idle} without a cell (MLClusterConfig.session_idle_timeout)",
                )
            t.flush()

    def idle_expired(self) -> bool:
        """No cell for session_idle_timeout since the ranks could take one: a session whose
        ranks wait (for a node, in a queue) or whose cell waits for them is not idle."""
        assert self.transport is not None
        if self.inbox.pending or not self.transport.ready():
            return False
        if not self.ready_seen:
            self.ready_seen = True
            self.inbox.last_activity = max(self.inbox.last_activity, time.monotonic())
        limit = self.ctx.config.session_idle_timeout
        return bool(limit) and time.monotonic() - self.inbox.last_activity > limit

    def died(self, rank: int | None, text: str) -> Outcome:
        """The session ends, failed: final before its cell is (whoever reads the cell's
        failure and runs the next cell finds the session ended, never a dying one)."""
        why = f"session ended: {text}"
        self.ctx.set_state(JobState.FAILED, error=why, reason=text, failed_rank=rank)
        if self.cell is not None:
            self.finish(failed=(rank, f"{text}; the session ended (its state is lost)"))
        self.inbox.end_waiting_cells(f"the session ended before the cell ran: {text}")
        return Outcome(OutcomeKind.FAILED, text, rank, restartable=False)

    # -- cells ---------------------------------------------------------------------------

    def admitted(self, cell_id: str) -> JobRecord | None:
        """The cell, if it is a waiting cell of this session (its owner's, its gang's)."""
        holder = self.ctx.job
        try:
            record = self.store.get_job(cell_id)
        except UnknownJob:
            return None
        if (
            record.state != JobState.STARTING
            or record.origin.get("session_job") != holder.id
            or record.owner != holder.owner
            or record.spec.workers != holder.spec.workers
        ):
            return None
        return record

    def begin(self, cell_id: str) -> bool:
        """Claim the cell, then start it on the ranks; False if `cell_id` is no waiting
        cell of this session (nothing to run)."""
        from .running.supervisor import JobContext, claim

        record = self.admitted(cell_id)
        if record is None:
            return False
        assert self.transport is not None
        self.inbox.last_activity = time.monotonic()
        store = self.store
        if not claim(store, cell_id):
            self.unclaimed(cell_id)
            return True
        # The ranks get the cell first: the cell's context (its log files) and its state
        # are not on the path from submit to the user's code.
        error = self.transport.send_cell(cell_id)
        cell = self.transport.new_cell(
            JobContext(store, record, self.ctx.config, self.ctx.store_watch)
        )
        if error is not None:
            cell.ctx.set_state(JobState.FAILED, error=error, reason=None)
            with contextlib.suppress(OSError):
                cell.ctx.logs.close()
            mark_ended(store, cell_id)
            return True
        self.cell = cell
        self.transport.flush_ranks()  # the ranks as they stand, before the cell runs
        now = time.time()
        cell.ctx.set_state(JobState.RUNNING, started=now, reason=None)
        cell.ctx.set_ranks(
            {
                r: {"state": RankState.RUNNING, "host": self.transport.rank_host(r), "started": now}
                for r in self.transport.rank_numbers
            }
        )
        return True

    def unclaimed(self, cell_id: str) -> None:
        """A cell this supervisor could not claim is not run: one settled meanwhile
        (cancelled before it ran) keeps its final state; any other fails saying why."""
        with contextlib.suppress(UnknownJob):
            if not self.store.get_job(cell_id).final:
                why = (
                    "the session's supervisor could not claim the cell (another supervisor"
                    " holds it): it did not run"
                )
                self.store.transition(cell_id, JobState.FAILED, error=why, reason=why)
            self.ctx.logs.system(f"[mlcluster] cell {cell_id} was settled before it ran")
            mark_ended(self.store, cell_id)

    def rank_done(self, rank: int, record: dict[str, Any]) -> None:
        """A rank's `cell_done` report."""
        cell = self.cell
        if cell is None or record.get("job") != cell.id:
            return
        if cell.rank_done(rank, str(record.get("status"))):
            self.interrupt(f"rank {rank} failed")

    def interrupt(self, why: str) -> None:
        cell, t = self.cell, self.transport
        assert cell is not None and t is not None  # called while a cell runs
        cell.interrupting(why)
        t.interrupt(cell.id, [r for r in t.rank_numbers if r not in cell.done])

    def advance(self) -> OutcomeKind | None:
        cell, t = self.cell, self.transport
        assert cell is not None and t is not None  # called while a cell runs
        why = cell.stop_reason()
        if why:
            self.interrupt(why)
        if len(cell.done) == len(t.rank_numbers):
            t.settle_output()
            self.finish()
            return None
        grace = self.ctx.config.session_interrupt_grace
        if cell.past_grace(grace):
            lost = cell.stuck_text(t.rank_numbers, grace)
            t.kill()
            self.finish(lost=lost)
            return RESTART
        return None

    def end_cell_now(self, why: str) -> None:
        """The session stops or restarts under a running cell: it is cancelled, saying so."""
        if self.cell is not None:
            self.cell.stop = self.cell.stop or ("cancelled", why)
            self.finish(lost=why)

    def finish(
        self, *, lost: str | None = None, failed: tuple[int | None, str] | None = None
    ) -> None:
        cell, self.cell = self.cell, None
        assert cell is not None and self.transport is not None  # called while a cell runs
        # The ranks' news (their "started" came before their reports) is in the store
        # before the cell's end is: whoever reads the end sees the session as it stands.
        self.transport.cell_ended()
        # The session's count first: whoever reads the cell's end (its kernel, at once)
        # and then the session finds the cell counted.
        inbox = self.inbox
        inbox.cells += 1
        inbox.last_activity = time.monotonic()
        self.store.update_session(self.ctx.job.id, cells=inbox.cells, idle_since=time.time())
        cell.finish(
            self.store,
            self.transport.rank_numbers,
            lost=lost,
            failed=failed,
            refused=cell.result_refused,
        )

    # -- where the ranks' output goes ----------------------------------------------------

    def logs_now(self) -> Any:
        """The running cell's logs, else the session's (between cells)."""
        return (self.cell.ctx if self.cell is not None else self.ctx).logs
