"""A Kubernetes job's life, inside its supervisor process (`KubernetesBackend.run`).

One `JobRun` per job; one `_Attempt` per try (`--max-restarts` re-creates everything):

1. create the objects (job object suspended, then its owned Secrets/Service/PodGroup, then
   resume), or adopt them when a new supervisor takes over a job that lives on. The payload
   Secrets have names derived from the job's key (unguessable), are only ever created here,
   and are trusted by uid: each one's uid is recorded when this supervisor creates it, an
   existing one (409) is never taken as ours unless its uid is recorded, and all are checked
   again before the job is resumed. So nobody else's code runs in the job's ranks;
   and rank 0's result counts only when signed with the job's key (runtime/protocol.py);
2. follow it with two watches (`kubeconn.ConnectionListWatch` threads: the job object and
   the job's pods by label) and one log stream per pod, all feeding one event queue that
   this thread alone consumes: states, reasons, logs, results, errors go to the store;
3. on an outcome (success, a failed rank, cancel, timeout) read the remaining logs, delete
   the job object with foreground propagation and wait until it and its pods are gone.

What is where: here `JobRun`, and the `_Attempt`: its following loop, event queue, the
ranks' states and records. The attempt's parts are objects of their own: its cluster objects
(supervise_objects.AttemptObjects: steps 1 and 3), its watches and what they last said
(supervise_watches), its pods' log streams (supervise_logs.LogStreams), rank 0's result
(results.ResultAssembler), why it waits (supervise_waiting.WaitingReason) and its forensics.
"""

from __future__ import annotations

import functools
import json
import logging
import queue
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from ...jobs import lifecycle
from ...jobs.lifecycle import Outcome, OutcomeKind
from ...jobs.model import JobSpec, JobState, RankState
from ...jobs.storage.store import JobStore
from ...runtime.atomic import write_whole
from ...runtime.protocol import job_key, key_path
from .client import Connection, Resources, kind_of, message_of, served_kinds
from .forensics import AttemptForensics
from .logs import MAX_POD_LINE, stored_line_counts
from .objects import container_name, job_selector, object_name, pod_ranks
from .plan import JobPlan
from .results import ResultAssembler
from .status import (
    Observation,
    later_rank_state,
    observe,
    pod_belongs,
    pod_usage,
    rank_fields,
)
from .supervise_logs import LOG_DRAIN_TIMEOUT, LOOP_TICK, LogStreams
from .supervise_objects import AttemptObjects
from .supervise_waiting import WaitingReason
from .supervise_watches import AttemptWatches, ClusterView

if TYPE_CHECKING:
    from ...jobs.running.supervisor import JobContext
    from ...jobs.storage.series import SeriesWriter
    from .shared_watches import SharedCluster

log = logging.getLogger("jupyterlab_mlcluster.supervisor")
T = TypeVar("T")

METRICS_API_INTERVAL = 5.0  # metrics-server scrapes every 15 s by default; no use asking often

_STATE_ORDER = {JobState.QUEUED: 0, JobState.STARTING: 1, JobState.RUNNING: 2}


class JobRun:
    def __init__(
        self,
        ctx: JobContext,
        plan: JobPlan,
        conn: Connection,
        shared: SharedCluster | None = None,
    ) -> None:
        """`shared`: a fleet's watches (shared_watches.py), else each attempt its own."""
        self.ctx = ctx
        self.plan = plan
        self.conn = conn
        self.shared = shared
        self.spec: JobSpec = ctx.job.spec
        self.store: JobStore = ctx.store
        self.res = Resources(conn)
        self.kind = kind_of(plan.api_version, plan.kind)
        self.name = object_name(ctx.job.id, self.spec.name)
        # Signs the ranks' records and names the payload Secrets (never leaves the job's
        # private directory, except in those Secrets).
        self.key = job_key(key_path(self.store.payload_path(ctx.job.id)))

    @functools.cached_property
    def metrics_api(self) -> bool:
        """Whether pod metrics come from the metrics API (asked once, when first needed)."""
        return self.plan.ranks_per_pod == 1 and "PodMetrics" in _quietly(
            lambda: served_kinds(self.conn, "metrics.k8s.io/v1beta1"), set[str]()
        )

    def run(self) -> None:
        lifecycle.run_attempts(
            self.ctx,
            lambda number: _Attempt(self, number).run(),
            before_restart=lambda: self.ctx.set_all_ranks(
                state=RankState.PENDING,
                exit_code=None,
                host=None,
                started=None,
                finished=None,
                progress=None,
            ),
        )


def _quietly(fn: Callable[[], T], default: T) -> T:
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - optional knowledge (e.g. discovery forbidden)
        log.debug("ignored: %s", exc)
        return default


class _Attempt:
    """One try: objects created (or adopted), followed to an outcome, deleted."""

    def __init__(self, run: JobRun, number: int) -> None:
        self.run_ = run
        self.ctx = run.ctx
        self.spec = run.spec
        self.plan = run.plan
        self.number = number
        self.container = container_name(self.plan.engine)
        # What the watches and the pods' log streams say, consumed by this thread alone.
        self.events: queue.Queue[tuple[Any, ...]] = queue.Queue()
        say = self.ctx.logs.system
        self.objects = AttemptObjects(run, number)
        self.view = ClusterView()
        job = (run.kind, run.name, self.ctx.job.id)
        self.watches = AttemptWatches(
            run.conn, self.plan.namespace, *job, self.events, say, run.shared
        )
        # A fleet wakes the loop when the job's row changes (a cancel), so it may wait long.
        self.ctx.on_wake(lambda: self.events.put(("wake", None)))
        self.last_news = time.monotonic()
        placement = (self.plan.engine, self.plan.ranks_per_pod)
        self.logs = LogStreams(
            run.conn,
            self.plan.namespace,
            self.container,
            placement,
            run.key,
            self.events,
            self.rank_item,
            say,
        )
        self.result = ResultAssembler(self.ctx)
        self.waiting = WaitingReason(run.conn, self.plan, run.name)
        # what the ranks told us
        self.started_ranks: set[int] = set()
        self.installing: set[int] = set()  # ranks whose pods install the notebook's packages
        self.runtime_metrics: dict[int, dict[str, Any]] = {}
        self.rank_updates = lifecycle.RankUpdates(run.ctx, series=self.series_now)
        self.written: dict[int, dict[str, Any]] = {}
        self.state_order = -1
        self.last_metrics = 0.0
        self.last_metrics_api = 0.0
        # Stalls, and the stacks of ranks still alive when the attempt ends (forensics.py).
        self.forensics = AttemptForensics(self)
        self.stalled: Outcome | None = None  # --on-stall cancel's

    def series_now(self) -> SeriesWriter:
        """Where the ranks' logged points go now (a session's: its running cell's)."""
        return self.ctx.series

    # -- the whole attempt ------------------------------------------------------------------

    def run(self) -> Outcome:
        try:
            self.view.job = self.objects.create_or_adopt()
        except Exception as exc:
            outcome = Outcome(
                OutcomeKind.FAILED,
                f"could not create the job's Kubernetes objects: {message_of(exc)}",
                restartable=False,
            )
            log.debug("create failed", exc_info=True)
            self._delete()
            return outcome
        self.view.uid = self.objects.uid
        if self.objects.adopted:
            self.logs.adopted_skip = stored_line_counts(
                self.ctx.store, self.ctx.job.id, self.spec.workers
            )
        self.watches.start()
        try:
            outcome = self._follow()
            self._drain(outcome)
            if outcome.kind == OutcomeKind.SUCCEEDED and self.result.refused:
                outcome = Outcome(OutcomeKind.FAILED, self.result.refused, 0, restartable=False)
            self._blame_packed_rank(outcome)
        finally:
            self._delete()
            self.watches.stop()
            self.logs.stop()
        self._settle_ranks(outcome)
        return outcome

    def _delete(self) -> None:
        """The objects deleted, waited for while this loop goes on handling news."""

        def wait() -> None:
            self._pump(LOOP_TICK)
            self.logs.ensure(self.my_pods())
            self._flush()

        seem_gone = lambda: not self.watches.started or self.view.empty  # noqa: E731
        if self.objects.delete_and_wait(seem_gone, wait):
            self._flush(force=True)

    def _drain(self, outcome: Outcome) -> None:
        """The outcome is known; wait (a little) for the log lines that tell its story: all
        ranks' after a success (rank 0's result), the failing pod's after a failure."""
        if outcome.kind == OutcomeKind.SUCCEEDED:
            wanted = set(self.my_pods())
        elif outcome.kind == OutcomeKind.FAILED and outcome.failed_pod:
            wanted = {outcome.failed_pod}
        else:
            wanted = set()
        deadline = time.monotonic() + LOG_DRAIN_TIMEOUT
        while self.logs.unread(wanted, self.view.pods) and time.monotonic() <= deadline:
            self.logs.ensure(self.my_pods())
            self._pump(LOOP_TICK)
            self.ctx.tick()
        if self.result.incomplete:
            self.ctx.logs.system("[mlcluster] rank 0's result did not arrive completely", rank=0)
        self._flush(force=True)

    def _blame_packed_rank(self, outcome: Outcome) -> None:
        """In a pod of several ranks, the failing one is the one that reported an error."""
        pod = self.view.pods.get(outcome.failed_pod or "")
        if pod is None or self.plan.ranks_per_pod == 1:
            return
        for rank in pod_ranks(pod, self.plan.engine, self.plan.ranks_per_pod):
            if self.ctx.store.error_path(self.ctx.job.id, rank).exists():
                outcome.failed_rank = rank
                return

    def _settle_ranks(self, outcome: Outcome) -> None:
        """Ranks that did not finish were stopped by us (fail-fast, cancel, timeout)."""
        now = time.time()
        for rank in range(self.spec.workers):
            state = RankState(self.written.get(rank, {}).get("state", RankState.PENDING))
            if not state.final:
                self._rank_update(rank, {"state": RankState.CANCELLED, "finished": now})
        self._flush(force=True)

    # -- following --------------------------------------------------------------------------

    def _follow(self) -> Outcome:
        ctx, spec, view = self.ctx, self.spec, self.view
        changed = True
        while True:
            stop = lifecycle.stop_requested(ctx) or self.stalled
            if stop is not None:
                if stop.where is None:  # (a stall's were taken when it was seen)
                    stop.where = self.forensics.before_stop(str(stop.kind)) or None
                self.forensics.stopping = True
                return stop  # (the objects are deleted on the way out: run's finally)
            if view.job is None or (view.job.get("metadata") or {}).get("deletionTimestamp"):
                return Outcome(
                    OutcomeKind.FAILED,
                    f"the {self.plan.kind} {self.run_.name} was deleted outside mlcluster",
                    restartable=True,
                )
            if changed:
                obs = self._observe()
                self._report(obs)
                if obs.failure is not None:
                    if obs.failure.deadline:
                        return Outcome(OutcomeKind.TIMEOUT, lifecycle.timed_out(spec.timeout))
                    # A pod Kubernetes took away: its reason, not the rank's exit on SIGTERM.
                    rank = None if obs.failure.disrupted else obs.failure.rank
                    # The peers still waiting for the failed rank (read as it failed).
                    where = (
                        None
                        if rank is None
                        else self.forensics.before_stop("failed", exclude={rank}) or None
                    )
                    failure = obs.failure
                    return Outcome(
                        OutcomeKind.FAILED, failure.message, rank, failure.pod, where=where
                    )
                if obs.succeeded:
                    return Outcome(OutcomeKind.SUCCEEDED)
            else:
                self._flush()
                if self.waiting.held_reason is not None:
                    self.ctx.set_reason(self.waiting.held_text(view.uid))
                elif self.waiting.queued_reason is not None:
                    self.ctx.set_reason(self.waiting.queued_text(view.job is not None))
            self.logs.ensure(self.my_pods())
            changed = self._pump(self._idle_wait())

    def _idle_wait(self) -> float:
        """A tick while things happen, else the context's idle wait: a long one while the job
        waits for the cluster with nothing to poll (no rank started, no Kueue or Volcano
        standing to read again)."""
        if time.monotonic() - self.last_news < 1.0:
            return LOOP_TICK
        waiting = self.waiting.held_reason is not None or self.waiting.queued_reason is not None
        active = self.state_order >= _STATE_ORDER[JobState.RUNNING] or waiting
        return max(LOOP_TICK, self.ctx.idle_wait(active))

    def mine(self, pod: dict[str, Any]) -> bool:
        """One of this attempt's pods (not a leftover of an earlier one)."""
        return pod_belongs(
            pod,
            engine=self.plan.engine,
            owner_uid=self.view.uid,
            name=self.run_.name,
            attempt=str(self.number),
        )

    def my_pods(self) -> dict[str, dict[str, Any]]:
        """This attempt's pods, by name, as the watches last said."""
        return {name: pod for name, pod in self.view.pods.items() if self.mine(pod)}

    def _observe(self) -> Observation:
        return observe(
            self.view.job,
            self.view.judged_pods(),
            engine=self.plan.engine,
            workers=self.spec.workers,
            ranks_per_pod=self.plan.ranks_per_pod,
            gang=self.plan.gang,
            queue=self.plan.queue,
        )

    def _report(self, obs: Observation) -> None:
        ctx = self.ctx
        # Ranks first: whoever sees the job's new state or reason sees its ranks' too.
        for rank in range(self.spec.workers):
            pr = obs.ranks.get(rank)
            fields = rank_fields(pr) if pr is not None else {"state": RankState.PENDING}
            if rank in self.started_ranks:
                fields["state"] = later_rank_state(fields["state"], RankState.RUNNING)
            self._rank_update(rank, fields)
        self._flush()
        self.forensics.pods_changed()  # (a pod's IP: where its ranks' stack helpers are)
        order = _STATE_ORDER[obs.state]
        # Within one attempt a job only moves forward, unless Kueue suspends it again (preemption).
        if order > self.state_order or (obs.suspended and order < self.state_order):
            self.state_order = order
            if obs.state != ctx.job.state:
                job_fields: dict[str, Any] = {}
                if obs.state == JobState.RUNNING and not ctx.job.started:
                    ctx.job.started = job_fields["started"] = time.time()
                ctx.set_state(obs.state, **job_fields)
        job_exists = self.view.job is not None
        if obs.suspended:
            self.waiting.held(obs.reason)
            ctx.set_reason(self.waiting.held_text(self.view.uid))
        elif self.waiting.admitted(obs, job_exists):
            ctx.set_reason(self.waiting.queued_text(job_exists))
        else:
            ctx.set_reason(obs.reason or self._installing())

    def _installing(self) -> str | None:
        """While pods install the notebook's packages (before their ranks run)."""
        waiting = sorted(self.installing - self.started_ranks)
        if not waiting:
            return None
        count = len(self.plan.packages.get("requirements") or []) if self.plan.packages else 0
        ranks = ", ".join(map(str, waiting[:8])) + (", ..." if len(waiting) > 8 else "")
        return f"installing {count} package(s) the notebook added (rank {ranks})"

    def _rank_update(self, rank: int, fields: dict[str, Any]) -> None:
        written = self.written.setdefault(rank, {})
        changed = {k: v for k, v in fields.items() if written.get(k, ...) != v}
        if changed:
            written.update(changed)
            self.rank_updates.update(rank, **changed)

    def _flush(self, force: bool = False) -> None:
        now = time.monotonic()
        # A rank's state goes out at once (with the job's state and reason); progress waits.
        self.rank_updates.flush(force)
        if now - self.last_metrics >= self.ctx.config.metrics_interval:
            self.last_metrics = now
            self._record_metrics(now)
        self.ctx.tick()

    def _record_metrics(self, now: float) -> None:
        samples = {r: dict(m) for r, m in self.runtime_metrics.items()}
        self.runtime_metrics = {}
        if self.run_.metrics_api and now - self.last_metrics_api >= METRICS_API_INTERVAL:
            self.last_metrics_api = now
            for rank, usage in self._metrics_api_usage().items():
                samples.setdefault(rank, {"gpu_util": None, "gpu_memory_bytes": None}).update(usage)
        if samples:
            self.ctx.record_metrics(samples)
        self.stalled = self.stalled or self.forensics.sampled(samples)

    def _metrics_api_usage(self) -> dict[int, dict[str, Any]]:
        pod_metrics = self.run_.res.list_function(kind_of("metrics.k8s.io/v1beta1", "PodMetrics"))
        items: list[dict[str, Any]] = _quietly(
            lambda: (
                pod_metrics(self.plan.namespace, label_selector=job_selector(self.ctx.job.id)).items
            ),
            [],
        )
        usage: dict[int, dict[str, Any]] = {}
        for item in items:
            pod = self.view.pods.get((item.get("metadata") or {}).get("name", ""))
            if pod is None or not self.mine(pod):
                continue
            for rank in pod_ranks(pod, self.plan.engine, self.plan.ranks_per_pod):
                usage[rank] = pod_usage(item, self.container)
        return usage

    # -- events -----------------------------------------------------------------------------

    def _pump(self, timeout: float) -> bool:
        """Handle what arrived (waiting up to `timeout` for something); whether anything did."""
        try:
            item = self.events.get(timeout=timeout)
        except queue.Empty:
            return False
        self.last_news = time.monotonic()
        for _ in range(1000):  # then let the loop look at states again
            self._handle(item)
            try:
                item = self.events.get_nowait()
            except queue.Empty:
                break
        return True

    def _handle(self, item: tuple[Any, ...]) -> None:
        what = item[0]
        if self.view.take(item):
            return
        if what == "log":
            self.logs.fed(item[1], item[2])
        elif what == "log_end":
            self.logs.ended(item[1], item[2], self.view.pods.get(item[1]))
        elif what == "watch_error":
            self.watches.failed(item[1], item[2])

    # -- what the ranks say -----------------------------------------------------------------

    def rank_item(self, rank: int, kind: str, value: Any) -> None:
        """A rank's line or record from its pod log (a session's attempt serves cells)."""
        if kind == "line":
            self.ctx.logs.line(rank, "o", value)
            self.forensics.active(rank)
        elif kind == "progress":
            self._rank_update(rank, {"progress": lifecycle.clean_progress(value)})
            self.forensics.active(rank)
        elif kind == "control":
            self._control(rank, value)
        elif kind == "unread":  # a report over MAX_POD_LINE, cut short: dropped, said once
            self.ctx.logs.unread_record(rank, over=f"{MAX_POD_LINE >> 20} MiB")

    def _control(self, rank: int, record: dict[str, Any]) -> None:
        rtype = record.get("type")
        if rtype == "started":
            self.started_ranks.add(rank)
            self.forensics.active(rank)
            state = self.written.get(rank, {}).get("state", RankState.PENDING)
            if not RankState(state).final:
                self._rank_update(rank, {"state": RankState.RUNNING})
        elif rtype == "progress":
            self._rank_update(rank, {"progress": lifecycle.clean_progress(record)})
            self.forensics.active(rank)
        elif rtype == "stacks_port":  # where its stack helper listens (forensics.py)
            self.forensics.port(rank, record.get("port"))
        elif rtype == "failing":  # its code raised; it waits while its peers are read
            self.forensics.on_failing(rank)
        elif rtype == "metrics":
            self.runtime_metrics[rank] = {
                k: record.get(k)
                for k in ("cpu_percent", "memory_bytes", "gpu_util", "gpu_memory_bytes")
            }
        elif rtype == "error":
            report = {k: v for k, v in record.items() if k != "type"}
            path = self.ctx.store.error_path(self.ctx.job.id, rank)
            write_whole(path, json.dumps(report).encode())
        elif rtype == "result" and rank == 0:  # a result comes from rank 0 or from nobody
            self.result.take(record)
        elif rtype == "packages":  # the pod installs the notebook's packages (its log says more)
            if record.get("state") == "installing":
                self.installing.add(rank)
            else:
                self.installing.discard(rank)
