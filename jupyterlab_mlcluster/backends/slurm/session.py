"""A session's ranks as the tasks of one Slurm allocation, inside the session's supervisor.

The session's holder job (jobs/sessions.py) is submitted as a Slurm job is (backend.py's
attempt: the same batch script, one srun step, the same rank files on the shared
filesystem, the same squeue watch and scancel), with the session's name in its tasks'
variables, so that each task's worker serves cells (runtime/session_worker.py) instead of
running one payload. The allocation and its ranks live from cell to cell; the session
engine (jobs/session_engine.py) admits, claims and finishes each cell, as on every backend.
This is its transport:

- a task is on a node of its own, which no pipe reaches: it listens on a TCP port and names
  its host and port in a signed record of its report file; the supervisor connects there
  (the Kubernetes session's `RankLink`: both sides prove the job's key, commands are signed
  for that connection, a rank unreachable for
  `MLClusterConfig.kubernetes_session_channel_timeout` ends the session);
- a cell's payload, error and result files are the store's (the shared filesystem), as a
  local rank's; its output comes from the rank files, drained when the rank reports it done;
- an interrupt is a signed `interrupt` command (only the cell it names is stopped);
- a task that exits, a node that fails, or an allocation Slurm ends (scancel, its time
  limit, preemption) ends the session, failed, saying so; stop, the idle timeout and a
  restart ask each rank to end as an interpreter does (atexit), then the allocation is
  cancelled: an idle session holds no node. A restart is a new allocation (fresh ranks);
  a supervisor that dies leaves the allocation to the reaper (its pending cleanup), and
  its ranks end by themselves when no supervisor reconnects.
"""

from __future__ import annotations

import logging
import select
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from ...jobs import lifecycle
from ...jobs.lifecycle import Outcome, OutcomeKind
from ...jobs.session_cells import SessionCell, series_now
from ...jobs.session_engine import SessionEngine
from ...jobs.session_link import RankLink
from ...runtime.protocol import job_key, key_path
from . import script
from .attempt import METRIC_FIELDS, Attempt

if TYPE_CHECKING:
    from ...jobs.running.supervisor import JobContext
    from ...jobs.storage.series import SeriesWriter
    from .backend import SlurmBackend

log = logging.getLogger("jupyterlab_mlcluster.supervisor")

ORPHAN_FLOOR = 10.0  # seconds: the least a rank waits for a supervisor before it ends


def serve_session(backend: SlurmBackend, ctx: JobContext) -> None:
    launch = ctx.store.read_launch(ctx.job.id)
    engine = SessionEngine(ctx, restarted_text="a fresh allocation and ranks, state lost")

    def incarnation(number: int) -> Outcome:
        attempt = SessionAllocation(backend, ctx, launch, number, engine)
        try:
            return attempt.run()
        finally:
            attempt.release()

    engine.run(incarnation)


class SessionAllocation(Attempt):
    """One incarnation of the session: its allocation and ranks, serving cells."""

    def __init__(
        self,
        backend: SlurmBackend,
        ctx: JobContext,
        launch: dict[str, Any],
        number: int,
        engine: SessionEngine,
    ):
        super().__init__(backend, ctx, launch, number)
        self.engine = engine
        give_up = ctx.config.kubernetes_session_channel_timeout
        key = job_key(key_path(str(ctx.store.payload_path(ctx.job.id))))
        self.links = {r: RankLink(r, key, give_up) for r in range(self.spec.workers)}
        self.addresses: dict[int, tuple[str, int]] = {}
        self.seq = 0
        self.stopping = False
        self.variables: dict[str, str] = {}  # what each task added to sbatch's environment

    # -- submit ------------------------------------------------------------------------

    def job_variables(self, base: dict[str, str]) -> dict[str, str]:
        env = super().job_variables(base)
        # A rank left without this supervisor (dead: the reaper cancels the allocation
        # too) ends by itself after twice the time this supervisor would wait for it.
        orphan = max(ORPHAN_FLOOR, 2 * self.ctx.config.kubernetes_session_channel_timeout)
        env.update(
            MLCLUSTER_SESSION=str(self.ctx.job.origin.get("session")),
            MLCLUSTER_SESSION_CHANNEL="tcp",
            MLCLUSTER_SESSION_ORPHAN_TIMEOUT=f"{orphan:g}",
        )
        self.variables = dict(env)
        return env

    # -- the incarnation -----------------------------------------------------------------

    def follow(self) -> Outcome:
        return self.engine.serve(self)

    def let_go(self) -> None:
        for link in self.links.values():
            link.close()

    def ended(self, outcome: Outcome) -> Outcome:
        self.stopping = True
        self.stop("the session ended" if outcome.kind != OutcomeKind.RESTART else "a restart")
        self.ctx.logs.maybe_notify(force=True)
        return outcome

    # -- the engine's transport ----------------------------------------------------------

    def series_now(self) -> SeriesWriter:
        return series_now(self.engine.cell, self.ctx)

    @property
    def rank_numbers(self) -> list[int]:
        return list(self.links)

    def await_news(self, timeout: float) -> None:
        # A cell's wake-up ends the wait at once; the ranks' files are looked at in turns.
        select.select([self.engine.inbox.fifo], [], [], timeout)
        self.pump()
        self.look()

    def dead(self) -> tuple[int | None, str] | None:
        if self.stopping:
            return None
        for rank, code in sorted(self.exits.items()):
            if code == 0:
                return rank, f"rank {rank} exited (status 0)"
            outcome = Outcome(OutcomeKind.FAILED, failed_rank=rank, exit_code=code)
            return rank, lifecycle.failure_text(self.ctx.store, self.ctx.job.id, outcome)
        if self.slurm_state not in script.ACTIVE_STATES:
            ended = self._ended()
            return ended.failed_rank, ended.message or f"Slurm job {self.slurm_id} ended"
        now = time.monotonic()
        for rank, link in self.links.items():
            host, port = self.addresses.get(rank, (None, None))
            link.address(host, port)
            link.ensure(now)
            if link.gave_up(now):
                return rank, (
                    f"rank {rank} could not be reached for {link.give_up_after:g} s"
                    f" ({link.last_error})"
                )
        return None

    def ready(self) -> bool:
        return self.running and all(link.up for link in self.links.values())

    def new_cell(self, ctx: JobContext) -> SessionCell:
        return SessionCell(ctx)

    def rank_host(self, rank: int) -> str | None:
        return self.links[rank].host

    def send_cell(self, cell_id: str) -> str | None:
        store = self.ctx.store
        # The cell's environment: its submitter's now (as sbatch would have it), with what
        # each task added to it at the start.
        env = {**self.cell_environment(store.read_launch(cell_id)), **self.variables}
        for rank in self.links:
            self._send(
                rank,
                {
                    "type": "cell",
                    "job": cell_id,
                    "payload": str(store.payload_path(cell_id)),
                    "error": str(store.error_path(cell_id, rank)),
                    "result": str(store.result_path(cell_id)) if rank == 0 else None,
                    "env": env,
                },
            )
        return None

    def cell_environment(self, launch: dict[str, Any]) -> dict[str, str]:
        held, self.launch = self.launch, launch
        try:
            return self.sbatch_environment()
        finally:
            self.launch = held

    def interrupt(self, cell_id: str, ranks: list[int]) -> None:
        for rank in ranks:
            self._send(rank, {"type": "interrupt", "job": cell_id})

    def settle_output(self) -> None:
        """Each rank's report is in a file of its own: what it wrote before is read now."""
        for rank in self.links:
            self._drain_rank(rank)
            for stream in ("o", "e"):
                self._handle(rank, stream, self.parsers[(rank, stream)].flush())

    def kill(self) -> None:
        self.stopping = True
        self.stop("ranks stuck past the interrupt's grace")
        for rank in self.links:
            self._drain_rank(rank)

    def flush_ranks(self) -> None:
        self.rank_updates.flush(force=True)

    def cell_ended(self) -> None:
        for link in self.links.values():
            link.forget()
        self.rank_updates.flush(force=True)

    def flush(self, force: bool = False) -> None:
        super().flush(force)
        if self.engine.cell is not None:
            self.engine.cell.ctx.logs.maybe_notify()

    def shut_down(self) -> None:
        """Ask every rank to end as an interpreter does (atexit); wait for their exits up
        to the kill grace (the allocation's stop then ends what is left)."""
        self.stopping = True
        asked = [rank for rank, link in self.links.items() if link.up]
        for rank in asked:
            self._send(rank, {"type": "stop"})
        deadline = time.monotonic() + self.ctx.config.kill_grace_period
        while asked and time.monotonic() < deadline and not self._tasks_done():
            self.await_news(0.05)
            self.ctx.tick()

    def _send(self, rank: int, command: dict[str, Any]) -> None:
        self.seq += 1
        self.links[rank].send({**command, "seq": self.seq})

    # -- what the rank files say ---------------------------------------------------------

    def _handle(self, rank: int, stream: str, items: Iterable[tuple[str, Any]]) -> None:
        rest = []
        for kind, value in items:
            if kind == "line" and stream != "c":
                self.engine.logs_now().line(rank, stream, value)
                self.forensics.active(rank)
            elif kind == "control" and value.get("type") == "cell_done":
                self.engine.rank_done(rank, value)
            elif kind == "control" and value.get("type") == "session_channel":
                host, port = value.get("host"), value.get("port")
                if isinstance(host, str) and isinstance(port, int) and 0 < port < 65536:
                    self.addresses[rank] = (host, port)
            else:
                rest.append((kind, value))
                cell = self.engine.cell
                if cell is not None and kind == "control" and value.get("type") == "metrics":
                    sample = {k: value.get(k) for k in METRIC_FIELDS}  # the cell's monitor too
                    self.ctx.store.record_metrics(cell.id, {rank: sample}, ts=time.time())
        if rest:
            super()._handle(rank, stream, rest)
