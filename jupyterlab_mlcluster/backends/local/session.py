"""A session's ranks on this machine, inside the session's supervisor (jobs/sessions.py).

The session's holder job was admitted like any job (its allocation holds the gang's slots
and GPUs). Its supervisor starts the ranks once, as a job's (cold or forked warm, same
environment, containment and report pipes: gang.py's `Gang`), each running
runtime/session_worker.py with a private command pipe on its stdin, and then serves cells:

- a cell (a job stored `starting`, naming this session) arrives by the session's FIFO or
  the store scan; the supervisor checks it is this session's and its owner's, claims it,
  sends every rank a signed command (the session key, a rising sequence number), and writes
  the ranks' output into the cell's logs while it runs;
- each rank reports `cell_done` (ok, error, interrupted); when all have, the cell's output is
  drained and the cell finished like a job (succeeded with rank 0's result, failed with the
  failing rank's report, cancelled);
- a cancel request or the cell's timeout interrupts every rank (SIGINT: KeyboardInterrupt
  in the cell's code); a rank's failure interrupts the others. Ranks that do not return
  within `session_interrupt_grace` (stuck in a collective) are killed and the session
  restarts with fresh ranks: the cell says its state was lost;
- a rank process that dies ends the session (failed, with how it died); the holder's
  cancel (`stop`), `session_idle_timeout` without a cell, or a restart request end or
  renew the ranks: `stop` first, so they run their atexit handlers.
"""

from __future__ import annotations

import contextlib
import logging
import os
import selectors
import signal
import time
from typing import TYPE_CHECKING, Any

from ...jobs import lifecycle
from ...jobs.lifecycle import Outcome, OutcomeKind
from ...jobs.model import JobState, RankState
from ...jobs.session_cells import SessionCell, SessionInbox
from ...jobs.storage.store import UnknownJob
from ...runtime.protocol import encode_record, job_key, key_path
from . import launcher
from .gang import LOOP_TICK, Gang

if TYPE_CHECKING:
    from ...jobs.running.supervisor import JobContext

log = logging.getLogger("jupyterlab_mlcluster.supervisor")

FIFO_STREAM = "fifo"


def serve_session(ctx: JobContext, spec, allocation, launch, sampler, tree) -> None:
    _Server(ctx, spec, allocation, launch, sampler, tree).run()


class _Server(SessionInbox):
    """The session across its incarnations (a restart starts fresh ranks, same allocation)."""

    def __init__(self, ctx: JobContext, spec, allocation, launch, sampler, tree):
        super().__init__(ctx)
        self.gang_args: tuple[Any, Any, Any, Any, Any] = (spec, allocation, launch, sampler, tree)

    def run(self) -> None:
        attempt = self.holder.restarts
        try:
            while True:
                gang = SessionGang(self, attempt)
                if gang.run_session() != "restart":
                    return
                attempt += 1
                self.store.update_job(self.holder.id, restarts=attempt)
                self.ctx.job.restarts = attempt
                self.ctx.logs.system("[mlcluster] session restarted: fresh ranks, state lost")
        finally:
            self.close()
            self.end_waiting_cells()


class SessionGang(Gang):
    """One incarnation of the session's ranks."""

    def __init__(self, server: _Server, attempt: int):
        super().__init__(server.ctx, *server.gang_args[:3], attempt, *server.gang_args[3:])
        self.server = server
        self.store = server.store
        self.commands: dict[int, int] = {}  # rank -> the write end of its command pipe
        self.rank_vars: dict[int, dict[str, str]] = {}
        self.key = job_key(key_path(self.store.payload_path(self.ctx.job.id)))
        self.seq = 0
        self.cell: SessionCell | None = None

    # -- ranks ---------------------------------------------------------------------------

    def spawn(self, rank: int, env: dict[str, str], payload_path: str, warm: bool):
        env = dict(env, MLCLUSTER_SESSION=str(self.ctx.job.origin.get("session")))
        base = launcher.base_environment(self.launch.get("env", {}))
        # What this rank's environment adds to its submitter's: kept under every cell's own.
        self.rank_vars[rank] = {k: v for k, v in env.items() if base.get(k) != v}
        read_end, write_end = os.pipe()
        try:
            cwd = self.launch.get("cwd")
            if warm:
                proc = launcher.spawn_forked(rank, env, cwd, payload_path, stdin=read_end)
            else:
                proc = launcher.spawn_cold(rank, env, cwd, stdin=read_end)
        except BaseException:
            os.close(write_end)
            raise
        finally:
            os.close(read_end)
        self.commands[rank] = write_end
        return proc

    def send(self, rank: int, command: dict[str, Any]) -> bool:
        self.seq += 1
        data = encode_record({**command, "seq": self.seq}, self.key, rank)
        fd = self.commands.get(rank)
        if fd is None:
            return False  # the rank is gone: the loop sees its exit
        try:
            while data:
                data = data[os.write(fd, data) :]
        except (OSError, TypeError):
            return False  # the rank is gone: the loop sees its exit
        return True

    def close_commands(self) -> None:
        for fd in self.commands.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self.commands.clear()

    # -- the loop ------------------------------------------------------------------------

    def run_session(self) -> str:
        """Serve cells until the session ends ("end") or must restart ("restart")."""
        try:
            self.start()
            self.selector.register(self.server.fifo, selectors.EVENT_READ, (-1, FIFO_STREAM))
            result = self.serve()
        except BaseException:
            self.close_commands()
            launcher.stop_ranks(self.ranks, 0.0)
            self.end_tree()
            raise
        with contextlib.suppress(KeyError, ValueError):
            self.selector.unregister(self.server.fifo)
        self.close_commands()
        self.end_tree()
        self.drain()
        return result

    def on_readable(self, fd: int, stream: str) -> None:
        if stream == FIFO_STREAM:
            self.server.read_fifo()

    def serve(self) -> str:
        ctx, server = self.ctx, self.server
        server.scan(force=True)
        while True:
            self.pump(LOOP_TICK)
            for p in self.ranks:
                if p.rank in self.done or p.poll() is None:
                    continue
                self.done.add(p.rank)
                self.drain_rank(p.rank)
                return self.rank_died(p)
            reason = ctx.cancelled()
            if reason:
                if reason.startswith("cancelled by user"):  # (who asked follows, if said)
                    reason = "stopped by user" + reason[len("cancelled by user") :]
                self.end_cell_now(f"the session was stopped ({reason})")
                self.shut_down()
                ctx.set_state(JobState.CANCELLED, reason=reason)
                return "end"
            server.scan(self.cell.id if self.cell else None)
            if server.restart_requested:
                server.restart_requested = False
                self.store.update_session(ctx.job.id, restart_requested=0)
                self.end_cell_now("the session was restarted: its state is lost")
                self.shut_down()
                return "restart"
            if self.cell is not None:
                if self.advance_cell() == "restart":
                    return "restart"
            elif server.pending:
                # Past ids that name no waiting cell of this session at once, to a real one.
                while server.pending and not self.begin_cell(server.pending.popleft()):
                    pass
            elif self.idle_expired():
                idle = lifecycle.format_duration(ctx.config.session_idle_timeout)
                why = f"ended after {idle} without a cell (MLClusterConfig.session_idle_timeout)"
                self.shut_down()
                ctx.set_state(JobState.SUCCEEDED, reason=why)
                return "end"
            self.flush()

    def idle_expired(self) -> bool:
        limit = self.ctx.config.session_idle_timeout
        return bool(limit) and time.monotonic() - self.server.last_activity > limit

    def shut_down(self) -> None:
        """Ask every rank to end as an interpreter does (atexit), then stop what is left."""
        for rank in list(self.commands):
            self.send(rank, {"type": "stop"})
        self.close_commands()
        grace = self.ctx.config.kill_grace_period
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(p.poll() is None for p in self.ranks):
            self.pump(0.02)
        stopped = [p.rank for p in self.ranks if p.poll() is None]
        launcher.stop_ranks(self.ranks, 0.5, pump=self.pump)
        now = time.time()
        for p in self.ranks:
            self.done.add(p.rank)
            # What the exit says: a rank that aborted on its way out (a native library's
            # terminate) failed, one that had to be stopped was cancelled.
            if p.rank in stopped:
                state = RankState.CANCELLED
                with contextlib.suppress(OSError):
                    self.ctx.logs.system(
                        f"[mlcluster] rank {p.rank} had not exited {grace:g} s after the"
                        " session's stop: stopped",
                        rank=p.rank,
                    )
            elif p.returncode == 0:
                state = RankState.SUCCEEDED
            else:
                state = RankState.FAILED
                how = Outcome(OutcomeKind.FAILED, failed_rank=p.rank, exit_code=p.returncode)
                with contextlib.suppress(OSError):
                    self.ctx.logs.system(
                        f"[mlcluster] {lifecycle.failure_text(self.store, self.ctx.job.id, how)}"
                        " while the session stopped",
                        rank=p.rank,
                    )
            self.rank_updates.update(p.rank, state=state, exit_code=p.returncode, finished=now)
        # In the store before the session's end is: whoever reads the end sees how each
        # rank ended.
        self.rank_updates.flush(force=True)

    def rank_died(self, proc: launcher.RankProcess) -> str:
        outcome = Outcome(OutcomeKind.FAILED, failed_rank=proc.rank, exit_code=proc.returncode)
        text = lifecycle.failure_text(self.store, self.ctx.job.id, outcome)
        if proc.returncode == 0:
            text = f"rank {proc.rank} exited (status 0)"
        self.rank_updates.update(
            proc.rank, state=RankState.FAILED, exit_code=proc.returncode, finished=time.time()
        )
        self.close_commands()
        self.stop(f"rank {proc.rank} died")  # the others' output still goes to the cell's logs
        # The session is final before its cell is: whoever reads the cell's failure and
        # runs the next cell finds the session ended, never a dying one.
        why = f"session ended: {text}"
        self.ctx.set_state(JobState.FAILED, error=why, reason=text, failed_rank=proc.rank)
        if self.cell is not None:
            self.finish_cell(failed=(proc.rank, f"{text}; the session ended (its state is lost)"))
        self.server.end_waiting_cells(f"the session ended before the cell ran: {text}")
        return "end"

    # -- cells ---------------------------------------------------------------------------

    def begin_cell(self, cell_id: str) -> bool:
        """Start the cell on the ranks; False if `cell_id` is no waiting cell of this session."""
        from ...jobs.running.supervisor import JobContext, claim

        store, holder = self.store, self.ctx.job
        try:
            record = store.get_job(cell_id)
        except UnknownJob:
            return False
        if (
            record.state != JobState.STARTING
            or record.origin.get("session_job") != holder.id
            or record.owner != holder.owner
            or record.spec.workers != holder.spec.workers
        ):
            return False  # not a waiting cell of this session: nothing to run
        self.server.last_activity = time.monotonic()
        launch = store.read_launch(cell_id)
        base = launcher.base_environment(launch.get("env", {}))
        # The ranks get the cell first: the store's bookkeeping below (the claim, the
        # cell's state, its log files) is not on the path from submit to the user's code.
        for p in self.ranks:
            self.send(
                p.rank,
                {
                    "type": "cell",
                    "job": cell_id,
                    "payload": str(store.payload_path(cell_id)),
                    "error": str(store.error_path(cell_id, p.rank)),
                    "result": str(store.result_path(cell_id)) if p.rank == 0 else None,
                    "env": {**base, **self.rank_vars[p.rank]},
                },
            )
        cctx = JobContext(store, record, self.ctx.config)
        self.cell = SessionCell(cctx)
        if not claim(store, cell_id):
            # Settled meanwhile (cancelled before it ran, and the reaper made it final):
            # the ranks stop it at once; its final state stays what it is.
            self.cell.stop = ("cancelled", "cancelled before it ran")
            self.interrupt("the cell was cancelled before it ran")
            return True
        self.rank_updates.flush(force=True)  # the gang's ranks as they stand, with the cell
        now = time.time()
        cctx.set_state(JobState.RUNNING, started=now, reason=None)
        cctx.set_ranks(
            {
                p.rank: {"state": RankState.RUNNING, "host": "localhost", "started": now}
                for p in self.ranks
            }
        )
        return True

    def on_record(self, rank: int, record: dict[str, Any]) -> None:
        cell = self.cell
        if record.get("type") != "cell_done" or cell is None or record.get("job") != cell.id:
            return
        if cell.rank_done(rank, str(record.get("status"))):
            self.interrupt(f"rank {rank} failed")

    def interrupt(self, why: str) -> None:
        cell = self.cell
        assert cell is not None  # called while a cell runs
        cell.interrupting(why)
        for p in self.ranks:
            if p.rank not in cell.done and p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p.pid, signal.SIGINT)

    def advance_cell(self) -> str | None:
        cell = self.cell
        assert cell is not None  # called while a cell runs
        why = cell.stop_reason()
        if why:
            self.interrupt(why)
        if len(cell.done) == len(self.ranks):
            for p in self.ranks:
                self.drain_rank(p.rank)  # their last output came before their report
                self.end_lines(p.rank)
            self.finish_cell()
            return None
        grace = self.ctx.config.session_interrupt_grace
        if cell.past_grace(grace):
            lost = cell.stuck_text((p.rank for p in self.ranks), grace)
            self.close_commands()
            launcher.stop_ranks(self.ranks, 0.0, pump=self.pump)
            for p in self.ranks:
                self.done.add(p.rank)
                self.drain_rank(p.rank)
            self.finish_cell(lost=lost)
            return "restart"
        return None

    def end_lines(self, rank: int) -> None:
        """What the cell printed without a newline (`print('x', end='')`, or just before an
        interrupt) is the cell's last line, not the start of the next cell's output."""
        for stream in ("o", "e"):
            parser = self.parsers.get((rank, stream))
            if parser is not None:
                self._handle(rank, stream, parser.flush())

    def end_cell_now(self, why: str) -> None:
        """The session stops or restarts under a running cell: it is cancelled, saying so."""
        if self.cell is not None:
            self.cell.stop = self.cell.stop or ("cancelled", why)
            self.finish_cell(lost=why)

    def finish_cell(self, *, lost: str | None = None, failed: tuple[int, str] | None = None):
        cell, self.cell = self.cell, None
        assert cell is not None  # called while a cell runs
        # The gang's ranks' news (their "started" came before their reports) is in the store
        # before the cell's end is: whoever reads the end sees the session as it stands.
        self.rank_updates.flush(force=True)
        # The session's count first: whoever reads the cell's end (its kernel, at once)
        # and then the session finds the cell counted.
        self.server.cells += 1
        self.server.last_activity = time.monotonic()
        self.store.update_session(self.ctx.job.id, cells=self.server.cells, idle_since=time.time())
        cell.finish(self.store, [p.rank for p in self.ranks], lost=lost, failed=failed)

    # -- output and figures ----------------------------------------------------------------

    def log_line(self, rank: int, stream: str, text: str) -> None:
        if self.cell is not None:
            self.cell.ctx.logs.line(rank, stream, text)
        else:
            self.ctx.logs.line(rank, stream, text)

    def record_samples(self, samples: dict[int, dict[str, Any]]) -> None:
        super().record_samples(samples)
        if self.cell is not None:
            self.store.record_metrics(self.cell.id, samples, ts=time.time())

    def flush(self, force: bool = False) -> None:
        super().flush(force)
        if self.cell is not None:
            self.cell.ctx.logs.maybe_notify()
