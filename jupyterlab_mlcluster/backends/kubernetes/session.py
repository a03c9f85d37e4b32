"""A session's ranks as pods of a Kubernetes job, inside the session's supervisor.

The session's holder job (jobs/sessions.py) runs here as a Kubernetes job does
(supervise.py): the same plan and builders, the same objects (created suspended, the
payload Secrets carrying the job's key, resumed), the same watches and pod log streams,
the same deletion at the end. What differs: the pods run runtime/session_worker.py
($MLCLUSTER_SESSION in their environment) and serve cells instead of running one payload:

- each rank listens on a port it names in a signed record of its pod log; a `RankLink`
  (jobs/session_link.py) connects to the pod's IP there (connecting and writing on a thread
  of its own: this loop never waits for a rank), both sides proving the job's key, and
  carries the sequence-numbered commands signed for that connection; dropped, it
  reconnects with backoff, and a rank unreachable for
  `MLClusterConfig.kubernetes_session_channel_timeout` ends the session, saying so;
- a cell (a job stored `starting` naming this session; the session's FIFO and store scan
  find it) is admitted and claimed by the session engine (jobs/session_engine.py), as on
  every backend, and sent by this transport to every rank with its payload inline; the
  ranks' output streams back through the pod logs into the cell's logs, and each rank's
  signed `cell_done` (after its output, in the same stream) finishes the cell as locally:
  succeeded with rank 0's result (its signed chunks), failed with the failing rank's
  report, cancelled;
- pdb on a rank (`breakpoint()`, `%distributed_debug`): its prompt's records come in the
  pod log, the lines typed go back as commands, mirrored into the files the notebook's side
  reads (session_pdb.py);
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
import dataclasses
import json
import logging
import select
import time
from typing import TYPE_CHECKING, Any

from ...jobs import lifecycle
from ...jobs.lifecycle import Outcome, OutcomeKind
from ...jobs.model import RankState
from ...jobs.session_cells import SessionCell, series_now
from ...jobs.session_engine import SessionEngine
from ...jobs.session_link import RankLink
from ...runtime.atomic import write_whole
from .cleanup import set_pending_cleanup
from .objects import pod_ranks
from .payload import PayloadTooLarge, split_payload
from .results import ResultAssembler
from .session_pdb import PdbMirror
from .status import container_phase
from .supervise import JobRun, _Attempt
from .supervise_logs import LOOP_TICK

if TYPE_CHECKING:
    from ...jobs.running.supervisor import JobContext
    from ...jobs.storage.series import SeriesWriter
    from ...jobs.storage.store import JobStore
    from .client import Connection
    from .plan import JobPlan
    from .status import Observation

log = logging.getLogger("jupyterlab_mlcluster.supervisor")

ORPHAN_FLOOR = 10.0  # seconds: the least a rank waits for a supervisor before it ends


class SessionRun(JobRun):
    def __init__(self, ctx: JobContext, plan: JobPlan, conn: Connection) -> None:
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
        self.engine = SessionEngine(ctx, restarted_text="fresh pods, state lost")

    def run(self) -> None:
        self.engine.run(lambda number: _SessionAttempt(self, number).run())


class _Cell(SessionCell):
    """A cell on pods: rank 0's result comes in signed chunks over its pod log."""

    def __init__(self, ctx: JobContext) -> None:
        super().__init__(ctx)
        self.result = ResultAssembler(ctx)

    def result_chunk(self, record: dict[str, Any]) -> None:
        """One of rank 0's `result` records (a refusal fails the cell, saying why)."""
        self.result.take(record)
        self.result_refused = self.result.refused


class _SessionAttempt(_Attempt):
    """One incarnation of the session's pods (created, serving cells, deleted): the session
    engine's transport."""

    def __init__(self, run: SessionRun, number: int) -> None:
        super().__init__(run, number)
        self.engine = run.engine
        give_up = self.ctx.config.kubernetes_session_channel_timeout
        self.links = {r: RankLink(r, run.key, give_up) for r in range(self.spec.workers)}
        self.ports: dict[int, int] = {}
        self.seq = 0
        self.stopping = False
        self.changed = True  # news came since the pods were last looked at
        self.dropped: set[int] = set()  # ranks whose channel dropped (said once)
        self.pdb = PdbMirror(self.store, self.ctx.job.id, self._send, self.ctx.logs.system)

    def _follow(self) -> Outcome:
        try:
            return self.engine.serve(self)
        finally:
            self.pdb.close_all()
            for link in self.links.values():
                link.close()

    @property
    def store(self) -> JobStore:
        return self.ctx.store

    # -- the engine's transport -------------------------------------------------------------

    def series_now(self) -> SeriesWriter:
        return series_now(self.engine.cell, self.ctx)

    @property
    def rank_numbers(self) -> list[int]:
        return list(self.links)

    def await_news(self, timeout: float) -> None:
        self.logs.ensure(self.my_pods())
        self.changed = self._pump(timeout) or self.changed
        self.pdb.poll()

    def dead(self) -> tuple[int | None, str] | None:
        job = self.view.job
        if job is None or (job.get("metadata") or {}).get("deletionTimestamp"):
            return self._died(
                None, f"the {self.plan.kind} {self.run_.name} was deleted outside mlcluster"
            )
        if self.changed:
            self.changed = False
            obs = self._observe()
            self._report(obs)
            dead = self._dead_pod(obs)
            if dead is not None:
                return self._died(*dead)
        given_up = self._tend_links()
        if given_up is not None:
            return self._died(given_up.rank, self._unreachable(given_up))
        return None

    def ready(self) -> bool:
        return all(link.up for link in self.links.values())

    def new_cell(self, ctx: JobContext) -> SessionCell:
        return _Cell(ctx)

    def rank_host(self, rank: int) -> str | None:
        return self.links[rank].host

    def send_cell(self, cell_id: str) -> str | None:
        try:
            # The cap a job's payload Secrets have: a cell crosses to the pods inline.
            data = base64.b64encode(
                b"".join(split_payload(self.store.payload_path(cell_id).read_bytes()))
            )
        except PayloadTooLarge as exc:
            return str(exc)
        for rank in self.links:
            self._send(
                rank, {"type": "cell", "job": cell_id, "payload_data": data.decode(), "env": {}}
            )
        return None

    def interrupt(self, cell_id: str, ranks: list[int]) -> None:
        for rank in ranks:
            self._send(rank, {"type": "interrupt", "job": cell_id})

    def settle_output(self) -> None:
        """Each rank's report comes after its output, in the same pod log: nothing to wait for."""

    def kill(self) -> None:
        self.stopping = True  # the attempt's deletion stops the stuck pods

    def flush_ranks(self) -> None:
        self.rank_updates.flush(force=True)

    def cell_ended(self) -> None:
        self.pdb.close_all()
        for link in self.links.values():
            link.forget()
        self.rank_updates.flush(force=True)

    def flush(self) -> None:
        self._flush()

    def shut_down(self) -> None:
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
            mine = self.my_pods().values()
            if all(container_phase(p, self.container) == "terminated" for p in mine):
                break
            self._pump(LOOP_TICK)
            self.ctx.tick()

    # -- the pods ---------------------------------------------------------------------------

    def _dead_pod(self, obs: Observation) -> tuple[int | None, str] | None:
        """A pod of this attempt whose container ended while the session lives."""
        if self.stopping:
            return None
        if obs.failure is not None:
            return obs.failure.rank, obs.failure.message
        for pod in self.my_pods().values():
            if container_phase(pod, self.container) == "terminated":
                ranks = pod_ranks(pod, self.plan.engine, self.plan.ranks_per_pod)
                rank = ranks[0] if ranks else None
                return rank, f"rank {rank} exited (pod {pod['metadata']['name']} ended)"
        return None

    def _died(self, rank: int | None, text: str) -> tuple[int | None, str]:
        """What the engine says of the session's end; the pods go after it."""
        outcome = Outcome(OutcomeKind.FAILED, text, rank, restartable=False)
        text = lifecycle.failure_text(self.store, self.ctx.job.id, outcome)
        set_pending_cleanup(self.store, self.ctx.job.id, True)  # the pods go after this
        if rank is not None:
            self._rank_update(rank, {"state": RankState.FAILED, "finished": time.time()})
        self._flush(force=True)
        return rank, text

    # -- the links --------------------------------------------------------------------------

    def _tend_links(self) -> RankLink | None:
        """Addresses from the pods and their records; connect what is due; the link that
        stayed down too long, if any."""
        now = time.monotonic()
        hosts: dict[int, str] = {}
        for pod in self.my_pods().values():
            ip = (pod.get("status") or {}).get("podIP")
            if ip:
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
        cell = self.engine.cell
        if kind == "line":
            self.engine.logs_now().line(rank, "o", value)
            return
        if kind == "control":
            rtype = value.get("type")
            if rtype == "session_channel":
                port = value.get("port")
                if isinstance(port, int) and 0 < port < 65536:
                    self.ports[rank] = port
                return
            if rtype == "cell_done":
                self.engine.rank_done(rank, value)
                return
            if rtype == "pdb":
                self.pdb.take(rank, value, cell.id if cell is not None else None)
                return
            if cell is not None and rtype == "error":
                report = {k: v for k, v in value.items() if k != "type"}
                write_whole(self.store.error_path(cell.id, rank), json.dumps(report).encode())
                return
            if isinstance(cell, _Cell) and rtype == "result":
                if rank == 0:
                    cell.result_chunk(value)
                return
        super().rank_item(rank, kind, value)
