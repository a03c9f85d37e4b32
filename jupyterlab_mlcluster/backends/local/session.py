"""A session's ranks on this machine, inside the session's supervisor (jobs/sessions.py).

The session's holder job was admitted like any job (its allocation holds the gang's slots
and GPUs). Its supervisor starts the ranks once, as a job's (cold or forked warm, same
environment, containment and report pipes: gang.py's `Gang`), each running
runtime/session_worker.py with a private command pipe on its stdin, and then serves cells:

- a cell (a job stored `starting`, naming this session) arrives by the session's FIFO or
  the store scan; the session engine (jobs/session_engine.py) checks it is this session's
  and its owner's and claims it; this transport sends every rank a signed command (the
  session key, a rising sequence number) and writes the ranks' output into the cell's logs
  while it runs;
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
from ...jobs.model import RankState
from ...jobs.session_cells import SessionCell, series_now
from ...jobs.session_engine import SessionEngine
from ...runtime.protocol import encode_record, job_key, key_path
from ...runtime.submitter_env import base_environment
from . import launcher
from .gang import Gang

if TYPE_CHECKING:
    from ...jobs.model import JobSpec
    from ...jobs.running.proctree import Containment
    from ...jobs.running.supervisor import JobContext
    from ...jobs.storage.series import SeriesWriter
    from ...runtime.samplers import RankSampler

log = logging.getLogger("jupyterlab_mlcluster.supervisor")

FIFO_STREAM = "fifo"


def serve_session(
    ctx: JobContext,
    spec: JobSpec,
    allocation: dict[str, Any],
    launch: dict[str, Any],
    sampler: RankSampler,
    tree: Containment,
) -> None:
    engine = SessionEngine(ctx)
    args = (spec, allocation, launch, sampler, tree)
    engine.run(lambda number: SessionGang(engine, number, args).run_session())


class SessionGang(Gang):
    """One incarnation of the session's ranks: the engine's transport on this machine."""

    def __init__(self, engine: SessionEngine, attempt: int, gang_args: tuple[Any, ...]):
        spec, allocation, launch, sampler, tree = gang_args
        super().__init__(engine.ctx, spec, allocation, launch, attempt, sampler, tree)
        self.engine = engine
        self.store = engine.store
        self.commands: dict[int, int] = {}  # rank -> the write end of its command pipe
        self.rank_vars: dict[int, dict[str, str]] = {}
        self.key = job_key(key_path(self.store.payload_path(self.ctx.job.id)))
        self.seq = 0

    # -- ranks ---------------------------------------------------------------------------

    def spawn(
        self, rank: int, env: dict[str, str], payload_path: str, warm: bool
    ) -> launcher.RankProcess:
        env = dict(env, MLCLUSTER_SESSION=str(self.ctx.job.origin.get("session")))
        base = base_environment(self.launch.get("env", {}))
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

    # -- the incarnation -----------------------------------------------------------------

    def run_session(self) -> Outcome:
        """Start the ranks, serve cells on them until the session ends or restarts."""
        try:
            self.start()
            self.selector.register(self.engine.inbox.fifo, selectors.EVENT_READ, (-1, FIFO_STREAM))
            outcome = self.engine.serve(self)
        except BaseException:
            self.close_commands()
            launcher.stop_ranks(self.ranks, 0.0)
            self.end_tree()
            raise
        with contextlib.suppress(KeyError, ValueError):
            self.selector.unregister(self.engine.inbox.fifo)
        self.close_commands()
        self.end_tree()
        self.drain()
        return outcome

    def on_readable(self, fd: int, stream: str) -> None:
        if stream == FIFO_STREAM:
            self.engine.inbox.read_fifo()

    # -- the engine's transport ----------------------------------------------------------

    @property
    def rank_numbers(self) -> list[int]:
        return [p.rank for p in self.ranks]

    def await_news(self, timeout: float) -> None:
        self.pump(timeout)

    def dead(self) -> tuple[int | None, str] | None:
        for p in self.ranks:
            if p.rank in self.done or p.poll() is None:
                continue
            self.done.add(p.rank)
            self.drain_rank(p.rank)
            return self.rank_died(p)
        return None

    def ready(self) -> bool:
        return True

    def new_cell(self, ctx: JobContext) -> SessionCell:
        return SessionCell(ctx)

    def series_now(self) -> SeriesWriter:
        return series_now(self.engine.cell, self.ctx)

    def rank_host(self, rank: int) -> str | None:
        return "localhost"

    def send_cell(self, cell_id: str) -> str | None:
        store = self.store
        base = base_environment(store.read_launch(cell_id).get("env", {}))
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
        return None

    def interrupt(self, cell_id: str, ranks: list[int]) -> None:
        for p in self.ranks:
            if p.rank in ranks and p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p.pid, signal.SIGINT)

    def settle_output(self) -> None:
        for p in self.ranks:
            self.drain_rank(p.rank)  # their last output came before their report
            self.end_lines(p.rank)

    def kill(self) -> None:
        self.close_commands()
        launcher.stop_ranks(self.ranks, 0.0, pump=self.pump)
        for p in self.ranks:
            self.done.add(p.rank)
            self.drain_rank(p.rank)

    def flush_ranks(self) -> None:
        self.rank_updates.flush(force=True)

    def cell_ended(self) -> None:
        self.rank_updates.flush(force=True)

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

    def rank_died(self, proc: launcher.RankProcess) -> tuple[int | None, str]:
        outcome = Outcome(OutcomeKind.FAILED, failed_rank=proc.rank, exit_code=proc.returncode)
        text = lifecycle.failure_text(self.store, self.ctx.job.id, outcome)
        if proc.returncode == 0:
            text = f"rank {proc.rank} exited (status 0)"
        self.rank_updates.update(
            proc.rank, state=RankState.FAILED, exit_code=proc.returncode, finished=time.time()
        )
        self.close_commands()
        self.stop(f"rank {proc.rank} died")  # the others' output still goes to the cell's logs
        return proc.rank, text

    # -- output and figures ----------------------------------------------------------------

    def on_record(self, rank: int, record: dict[str, Any]) -> None:
        if record.get("type") == "cell_done":
            self.engine.rank_done(rank, record)

    def end_lines(self, rank: int) -> None:
        """What the cell printed without a newline (`print('x', end='')`, or just before an
        interrupt) is the cell's last line, not the start of the next cell's output."""
        for stream in ("o", "e"):
            parser = self.parsers.get((rank, stream))
            if parser is not None:
                self._handle(rank, stream, parser.flush())

    def log_line(self, rank: int, stream: str, text: str) -> None:
        self.engine.logs_now().line(rank, stream, text)

    def record_samples(self, samples: dict[int, dict[str, Any]]) -> None:
        super().record_samples(samples)
        if self.engine.cell is not None:
            self.store.record_metrics(self.engine.cell.id, samples, ts=time.time())

    def flush(self, force: bool = False) -> None:
        super().flush(force)
        if self.engine.cell is not None:
            self.engine.cell.ctx.logs.maybe_notify()
