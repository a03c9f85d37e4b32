"""A session's ranks as pods of a Kubernetes job, inside the session's supervisor.

The session's holder job (jobs/sessions.py) runs here as a Kubernetes job does
(supervise.py): the same plan and builders, the same objects (created suspended, the
payload Secrets carrying the job's key, resumed), the same watches and pod log streams,
the same deletion at the end. What differs: the pods run runtime/session_worker.py
($MLCLUSTER_SESSION in their environment) and serve cells instead of running one payload:

- each rank listens on a port it names in a signed record of its pod log; a `RankLink`
  (session_link.py) connects to the pod's IP there (connecting and writing on a thread
  of its own: this loop never waits for a rank), both sides proving the job's key, and
  carries the sequence-numbered commands signed for that connection; dropped, it
  reconnects with backoff, and a rank unreachable for
  `MLClusterConfig.kubernetes_session_channel_timeout` ends the session, saying so;
- a cell (a job stored `starting` naming this session; the session's FIFO and store scan
  find it, as locally: jobs/session_cells.py's `SessionInbox`) is claimed and sent to every rank
  with its payload inline; the ranks' output streams back through the pod logs into the
  cell's logs, and each rank's signed `cell_done` (after its output, in the same stream)
  finishes the cell as locally: succeeded with rank 0's result (its signed chunks), failed
  with the failing rank's report, cancelled;
- an interrupt (the cell's cancel, its timeout, another rank's failure) is an `interrupt`
  command: the rank raises KeyboardInterrupt in the cell's code. Ranks that do not return
  within `session_interrupt_grace`, and a restart request, renew the pods (a new attempt:
  fresh pods, the state lost, the cell says so);
- a pod that ends (its container exited, killed, evicted) ends the session, failed with
  what Kubernetes says of it; `stop` (the holder's cancel) asks every rank to end as an
  interpreter does (atexit) before the objects are deleted; `session_idle_timeout`
  without a cell ends it too. Nothing is left in the cluster: the attempt's deletion.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import json
import logging
import select
import time
from typing import TYPE_CHECKING, Any, cast

from ...jobs import lifecycle
from ...jobs.lifecycle import Outcome, OutcomeKind
from ...jobs.model import JobState, RankState
from ...jobs.session_cells import SessionCell, SessionInbox, mark_ended
from ...jobs.storage.store import UnknownJob
from . import supervise_logs
from .cleanup import set_pending_cleanup
from .objects import pod_ranks
from .payload import PayloadTooLarge, split_payload
from .session_link import RankLink
from .status import container_phase
from .supervise import JobRun, _Attempt
from .supervise_logs import LOOP_TICK, write_atomically

if TYPE_CHECKING:
    from ...jobs.running.supervisor import JobContext
    from .client import Connection
    from .plan import JobPlan

log = logging.getLogger("jupyterlab_mlcluster.supervisor")

RESTART = OutcomeKind.RESTART  # fresh pods, same session
ORPHAN_FLOOR = 10.0  # seconds: the least a rank waits for a supervisor before it ends


class SessionRun(JobRun):
    def __init__(self, ctx: JobContext, plan: JobPlan, conn: Connection):
        super().__init__(ctx, plan, conn)
        # Same builders, same objects: the session's name in the pods' environment makes
        # their worker a session rank (runtime/worker.py hands over to session_worker.py).
        # A rank left without this supervisor (dead, and nobody deleted the pods) ends by
        # itself after twice the time this supervisor would wait for it (session_channel.py).
        orphan = max(ORPHAN_FLOOR, 2 * ctx.config.kubernetes_session_channel_timeout)
        env = {
            **self.spec.env,
            "MLCLUSTER_SESSION": str(ctx.job.origin.get("session")),
            "MLCLUSTER_SESSION_ORPHAN_TIMEOUT": f"{orphan:g}",
        }
        self.spec = dataclasses.replace(self.spec, env=env)
        self.server = SessionInbox(ctx)  # the FIFO, the waiting cells, the counts

    def run(self) -> None:
        ctx = self.ctx
        number = ctx.job.restarts
        try:
            while True:
                outcome = _SessionAttempt(self, number).run()
                if outcome.kind != RESTART:
                    break
                number += 1
                self.store.update_job(ctx.job.id, restarts=number)
                ctx.job.restarts = number
                ctx.logs.system("[mlcluster] session restarted: fresh pods, state lost")
                ctx.set_all_ranks(
                    state=RankState.PENDING, exit_code=None, host=None, started=None, finished=None
                )
            if ctx.job.state.final:
                return  # said when it ended (a dead rank: before the cell's failure)
            # The cells still waiting fail first: whoever sees the session ended (stop
            # returns then) finds none of its cells waiting for it.
            if outcome.kind == OutcomeKind.SUCCEEDED:  # idle
                self.server.end_waiting_cells(f"the session ended: {outcome.message}")
                ctx.set_state(JobState.SUCCEEDED, reason=outcome.message)
            elif outcome.kind == OutcomeKind.CANCELLED:
                reason = outcome.message or "stopped"
                if reason.startswith("cancelled by user"):
                    reason = "stopped by user" + reason[len("cancelled by user") :]
                self.server.end_waiting_cells(f"the session ended: {reason}")
                ctx.set_state(JobState.CANCELLED, reason=reason)
            else:
                self.server.end_waiting_cells(f"the session ended: {outcome.message}")
                lifecycle.finish(ctx, outcome)
        finally:
            self.server.close()
            self.server.end_waiting_cells()


class _Cell(SessionCell):
    def __init__(self, ctx: JobContext):
        super().__init__(ctx)
        # rank 0's result chunks (supervise_logs.result_chunk reads these off an attempt)
        self.result_chunks: dict[str, dict[int, str]] = {}
        self.result_counts: dict[str, int] = {}
        self.result_refused: str | None = None
        self.result_received = 0
        self.json_form_refused = False


class _SessionAttempt(_Attempt):
    """One incarnation of the session's pods: created, serving cells, deleted."""

    def __init__(self, run: SessionRun, number: int):
        super().__init__(run, number)
        self.session = run
        self.server = run.server
        give_up = self.ctx.config.kubernetes_session_channel_timeout
        self.links = {r: RankLink(r, run.key, give_up) for r in range(self.spec.workers)}
        self.ports: dict[int, int] = {}
        self.seq = 0
        self.cell: _Cell | None = None
        self.stopping = False
        self.ready = False  # every rank's channel came up once (the idle clock runs since)
        self.dropped: set[int] = set()  # ranks whose channel dropped (said once)

    # -- the loop ---------------------------------------------------------------------------

    def _follow(self) -> Outcome:
        try:
            return self._serve()
        finally:
            for link in self.links.values():
                link.close()

    def _serve(self) -> Outcome:
        ctx, server = self.ctx, self.server
        server.scan(force=True)
        changed = True
        while True:
            reason = ctx.cancelled()
            if reason:
                self._end_cell_now(f"the session was stopped ({reason})")
                self._shut_down()
                return Outcome(OutcomeKind.CANCELLED, reason)
            if self.job is None or (self.job.get("metadata") or {}).get("deletionTimestamp"):
                return self._died(
                    None, f"the {self.plan.kind} {self.run_.name} was deleted outside mlcluster"
                )
            if changed:
                obs = self._observe()
                self._report(obs)
                dead = self._dead_pod(obs)
                if dead is not None:
                    return self._died(*dead)
            else:
                self._flush()
            server.read_fifo()
            server.scan(self.cell.id if self.cell else None)
            if server.restart_requested:
                server.restart_requested = False
                self.store.update_session(ctx.job.id, restart_requested=0)
                self._end_cell_now("the session was restarted: its state is lost")
                self._shut_down()
                return Outcome(RESTART)
            given_up = self._tend_links()
            if given_up is not None:
                return self._died(given_up.rank, self._unreachable(given_up))
            if self.cell is not None:
                if self._advance_cell() == RESTART:
                    return Outcome(RESTART)
            elif server.pending and all(link.up for link in self.links.values()):
                self._begin_cell(server.pending.popleft())
            elif self._idle_expired():
                idle = lifecycle.format_duration(ctx.config.session_idle_timeout)
                self._shut_down()
                return Outcome(
                    OutcomeKind.SUCCEEDED,
                    f"ended after {idle} without a cell (MLClusterConfig.session_idle_timeout)",
                )
            supervise_logs.ensure_log_streams(self)
            changed = self._pump(LOOP_TICK)

    @property
    def store(self):
        return self.ctx.store

    def _idle_expired(self) -> bool:
        """No cell for session_idle_timeout since the ranks were ready: a session whose
        pods wait (for a node, in a queue) or whose cell waits for them is not idle."""
        if self.server.pending or not all(link.up for link in self.links.values()):
            return False
        if not self.ready:
            self.ready = True
            self.server.last_activity = max(self.server.last_activity, time.monotonic())
        limit = self.ctx.config.session_idle_timeout
        return bool(limit) and time.monotonic() - self.server.last_activity > limit

    # -- the pods ---------------------------------------------------------------------------

    def _dead_pod(self, obs) -> tuple[int | None, str] | None:
        """A pod of this attempt whose container ended while the session lives."""
        if self.stopping:
            return None
        if obs.failure is not None:
            return obs.failure.rank, obs.failure.message
        for pod in self.pods.values():
            if self._mine(pod) and container_phase(pod, self.container) == "terminated":
                ranks = pod_ranks(pod, self.plan.engine, self.plan.ranks_per_pod)
                rank = ranks[0] if ranks else None
                return rank, f"rank {rank} exited (pod {pod['metadata']['name']} ended)"
        return None

    def _died(self, rank: int | None, text: str) -> Outcome:
        """The session ends, failed: final before its cell is (whoever reads the cell's
        failure and runs the next cell finds the session ended, never a dying one)."""
        ctx = self.ctx
        outcome = Outcome(OutcomeKind.FAILED, text, rank, restartable=False)
        text = lifecycle.failure_text(self.store, ctx.job.id, outcome)
        set_pending_cleanup(self.store, ctx.job.id, True)  # the pods go after this
        if rank is not None:
            self._rank_update(rank, {"state": RankState.FAILED, "finished": time.time()})
        self._flush(force=True)
        ctx.set_state(
            JobState.FAILED, error=f"session ended: {text}", reason=text, failed_rank=rank
        )
        if self.cell is not None:
            self._finish_cell(failed=(rank, f"{text}; the session ended (its state is lost)"))
        self.server.end_waiting_cells(f"the session ended before the cell ran: {text}")
        return outcome

    def _shut_down(self) -> None:
        """Ask every rank to end as an interpreter does (atexit), and wait a little for
        their pods to finish; the attempt's deletion stops what is left."""
        self.stopping = True
        asked = [rank for rank, link in self.links.items() if link.up]
        for rank in asked:
            self._send(rank, {"type": "stop"})
        if not asked:
            return  # no rank to wait for (its pods not started yet): the deletion stops them
        deadline = time.monotonic() + self.ctx.config.kill_grace_period
        while time.monotonic() < deadline:
            mine = [p for p in self.pods.values() if self._mine(p)]
            if all(container_phase(p, self.container) == "terminated" for p in mine):
                break
            self._pump(LOOP_TICK)
            self.ctx.tick()

    # -- the links --------------------------------------------------------------------------

    def _tend_links(self) -> RankLink | None:
        """Addresses from the pods and their records; connect what is due; the link that
        stayed down too long, if any."""
        now = time.monotonic()
        hosts: dict[int, str] = {}
        for pod in self.pods.values():
            ip = (pod.get("status") or {}).get("podIP")
            if ip and self._mine(pod):
                for rank in pod_ranks(pod, self.plan.engine, self.plan.ranks_per_pod):
                    hosts[rank] = ip
        for rank, link in self.links.items():
            link.address(hosts.get(rank, link.host), self.ports.get(rank))
            if not link.up and link.ensure(now) and rank in self.dropped:
                self.dropped.discard(rank)
                self.ctx.logs.system(f"[mlcluster] the channel to rank {rank} is back")
            if link.gave_up(now):
                return link
        up = [link for link in self.links.values() if link.up]
        readable, _, _ = select.select(up, [], [], 0) if up else ([], [], [])
        for link in readable:
            link.check_closed()
        for rank, link in self.links.items():
            if link.failures and rank not in self.dropped and link.host is not None:
                self.dropped.add(rank)
                self.ctx.logs.system(
                    f"[mlcluster] the channel to rank {rank} dropped ({link.last_error});"
                    " reconnecting"
                )
        return None

    def _unreachable(self, link: RankLink) -> str:
        return (
            f"rank {link.rank} could not be reached for {link.give_up_after:g} s"
            f" ({link.last_error})"
        )

    def _send(self, rank: int, command: dict[str, Any]) -> None:
        self.seq += 1
        self.links[rank].send({**command, "seq": self.seq})

    # -- what the pods' logs say ------------------------------------------------------------

    def rank_item(self, rank: int, kind: str, value: Any) -> None:
        cell = self.cell
        if kind == "line":
            (cell.ctx if cell is not None else self.ctx).logs.line(rank, "o", value)
            return
        if kind == "control":
            rtype = value.get("type")
            if rtype == "session_channel":
                port = value.get("port")
                if isinstance(port, int) and 0 < port < 65536:
                    self.ports[rank] = port
                return
            if rtype == "cell_done":
                self._cell_done(rank, value)
                return
            if cell is not None and rtype == "error":
                report = {k: v for k, v in value.items() if k != "type"}
                write_atomically(self.store.error_path(cell.id, rank), json.dumps(report).encode())
                return
            if cell is not None and rtype == "result":
                if rank == 0:
                    # The chunks' bookkeeping is the cell's (it has the attempt's fields).
                    supervise_logs.result_chunk(cast(Any, cell), value)
                return
        supervise_logs.rank_item(self, rank, kind, value)

    # -- cells ------------------------------------------------------------------------------

    def _begin_cell(self, cell_id: str) -> None:
        from ...jobs.running.supervisor import JobContext, claim

        store, holder = self.store, self.ctx.job
        try:
            record = store.get_job(cell_id)
        except UnknownJob:
            return
        if (
            record.state != JobState.STARTING
            or record.origin.get("session_job") != holder.id
            or record.owner != holder.owner
            or record.spec.workers != holder.spec.workers
        ):
            return  # not a waiting cell of this session: nothing to run
        self.server.last_activity = time.monotonic()
        cctx = JobContext(store, record, self.ctx.config)
        if not claim(store, cell_id):
            return  # settled meanwhile (cancelled before it ran): nothing to run
        try:
            # The cap a job's payload Secrets have: a cell crosses to the pods inline.
            data = base64.b64encode(
                b"".join(split_payload(store.payload_path(cell_id).read_bytes()))
            )
        except PayloadTooLarge as exc:
            cctx.set_state(JobState.FAILED, error=str(exc), reason=None)
            with contextlib.suppress(OSError):
                cctx.logs.close()
            mark_ended(store, cell_id)
            return
        self.cell = _Cell(cctx)
        for rank in self.links:
            self._send(
                rank,
                {"type": "cell", "job": cell_id, "payload_data": data.decode(), "env": {}},
            )
        self.rank_updates.flush(force=True)
        now = time.time()
        cctx.set_state(JobState.RUNNING, started=now, reason=None)
        cctx.set_ranks(
            {
                r: {"state": RankState.RUNNING, "host": self.links[r].host, "started": now}
                for r in self.links
            }
        )

    def _cell_done(self, rank: int, record: dict[str, Any]) -> None:
        cell = self.cell
        if cell is None or record.get("job") != cell.id:
            return
        if cell.rank_done(rank, str(record.get("status"))):
            self._interrupt(f"rank {rank} failed")

    def _interrupt(self, why: str) -> None:
        cell = self.cell
        assert cell is not None  # called while a cell runs
        cell.interrupting(why)
        for rank in self.links:
            if rank not in cell.done:
                self._send(rank, {"type": "interrupt", "job": cell.id})

    def _advance_cell(self) -> str | None:
        cell = self.cell
        assert cell is not None  # called while a cell runs
        why = cell.stop_reason()
        if why:
            self._interrupt(why)
        if len(cell.done) == len(self.links):
            self._finish_cell()
            return None
        grace = self.ctx.config.session_interrupt_grace
        if cell.past_grace(grace):
            self._finish_cell(lost=cell.stuck_text(self.links, grace))
            self.stopping = True  # the attempt's deletion stops the stuck pods
            return RESTART
        return None

    def _end_cell_now(self, why: str) -> None:
        """The session stops or restarts under a running cell: it is cancelled, saying so."""
        if self.cell is not None:
            self.cell.stop = self.cell.stop or ("cancelled", why)
            self._finish_cell(lost=why)

    def _finish_cell(
        self, *, lost: str | None = None, failed: tuple[int | None, str] | None = None
    ):
        cell, self.cell = self.cell, None
        assert cell is not None  # called while a cell runs
        for link in self.links.values():
            link.forget()
        self.rank_updates.flush(force=True)
        # The session's count first: whoever reads the cell's end (its kernel, at once)
        # and then the session finds the cell counted.
        self.server.cells += 1
        self.server.last_activity = time.monotonic()
        self.store.update_session(self.ctx.job.id, cells=self.server.cells, idle_since=time.time())
        cell.finish(self.store, self.links, lost=lost, failed=failed, refused=cell.result_refused)
