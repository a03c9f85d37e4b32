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

What is where: here `JobRun`, and `_Attempt`'s state, watches, following loop and event queue;
steps 1 and 3 (create, adopt, the payload Secrets' uids, delete and wait, the ranks' last
states) in supervise_objects.py; the log streams, control records, rank 0's result chunks and
the final drain in supervise_logs.py. Those are functions of the `_Attempt`.
"""

from __future__ import annotations

import functools
import logging
import queue
import threading
import time
from typing import TYPE_CHECKING, Any

from ... import kubeconn
from ...jobs import lifecycle
from ...jobs.lifecycle import Outcome, OutcomeKind
from ...jobs.model import JobSpec, JobState, RankState
from ...jobs.storage.store import JobStore
from ...runtime.protocol import job_key, key_path
from . import supervise_logs, supervise_objects
from .client import (
    Connection,
    Resources,
    kind_of,
    message_of,
    served_kinds,
)
from .forensics import AttemptForensics
from .kueue import KueueView, Standing, standing_text
from .logs import PodLogFollower, PodOutput
from .objects import (
    container_name,
    job_selector,
    object_name,
    pod_ranks,
)
from .plan import JobPlan
from .status import (
    Observation,
    later_rank_state,
    observe,
    pod_belongs,
    pod_usage,
    rank_fields,
)
from .supervise_logs import LOOP_TICK
from .volcano import PodGroupView

if TYPE_CHECKING:
    from ...jobs.running.supervisor import JobContext
    from ...jobs.storage.series import SeriesWriter

log = logging.getLogger("jupyterlab_mlcluster.supervisor")
WATCH_FAILURES = kubeconn.FailureLog(log)  # an outage: one line, then a count a minute

METRICS_API_INTERVAL = 5.0  # metrics-server scrapes every 15 s by default; no use asking often

_STATE_ORDER = {JobState.QUEUED: 0, JobState.STARTING: 1, JobState.RUNNING: 2}


class JobRun:
    def __init__(self, ctx: JobContext, plan: JobPlan, conn: Connection):
        self.ctx = ctx
        self.plan = plan
        self.conn = conn
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
            lambda: served_kinds(self.conn, "metrics.k8s.io/v1beta1"), set()
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


def _quietly(fn, default):
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - optional knowledge (e.g. discovery forbidden)
        log.debug("ignored: %s", exc)
        return default


class _Attempt:
    """One try: objects created (or adopted), followed to an outcome, deleted."""

    def __init__(self, run: JobRun, number: int):
        self.run_ = run
        self.ctx = run.ctx
        self.spec = run.spec
        self.plan = run.plan
        self.number = number
        self.events: queue.Queue = queue.Queue()
        self.job: dict[str, Any] | None = None
        self.uid: str | None = None
        self.pods: dict[str, dict[str, Any]] = {}
        self.container = container_name(self.plan.engine)
        # logs
        self.outputs: dict[str, PodOutput] = {}
        self.followers: dict[str, PodLogFollower] = {}
        self.log_done: set[str] = set()
        self.log_retry_at: dict[str, float] = {}
        self.log_failures: dict[str, int] = {}
        self.resume_skip: dict[str, dict[int, int]] = {}
        self.adopted_skip: dict[int, int] = {}
        # what the ranks told us
        self.started_ranks: set[int] = set()
        self.installing: set[int] = set()  # ranks whose pods install the notebook's packages
        self.result_chunks: dict[str, dict[int, str]] = {}  # form -> index -> base64
        self.result_counts: dict[str, int] = {}  # form -> chunks its chunk 0 announced
        self.result_refused: str | None = None  # why rank 0's result was dropped
        self.result_received = 0  # base64 characters of result chunks held
        self.json_form_refused = False  # rank 0's JSON form was over max_result_json_mib
        self.runtime_metrics: dict[int, dict[str, Any]] = {}
        self.rank_updates = lifecycle.RankUpdates(run.ctx, series=self.series_now)
        self.written: dict[int, dict[str, Any]] = {}
        self.state_order = -1
        self.last_metrics = 0.0
        self.last_metrics_api = 0.0
        self.reported_watch_errors: set[str] = set()
        self.watches: list[tuple[kubeconn.ListWatch, threading.Thread]] = []
        self._stopping = threading.Event()
        # Kueue: where the job stands while it is held (kueue.py), and whether Kueue had
        # admitted it before (then a suspension is a preemption).
        self.kueue = (
            KueueView(run.conn, self.plan.namespace, self.plan.queue)
            if self.plan.gang == "kueue" and self.plan.queue
            else None
        )
        self.kueue_standing: Standing | None = None
        # Volcano: while the gang waits, its PodGroup's phase and Unschedulable condition.
        self.volcano = (
            PodGroupView(run.conn, self.plan.namespace, run.name, self.plan.queue)
            if self.plan.gang == "volcano"
            else None
        )
        self.volcano_text: str | None = None
        self.queued_reason: str | None = None  # observe()'s reason while waiting for pods
        self.held_reason: str | None = None  # observe()'s reason while suspended
        self.admitted_once = False
        # Stalls, and the stacks of ranks still alive when the attempt ends (forensics.py).
        self.forensics = AttemptForensics(self)
        self.stalled: Outcome | None = None  # --on-stall cancel's

    def series_now(self) -> SeriesWriter:
        """Where the ranks' logged points go now (a session's: its running cell's)."""
        return self.ctx.series

    # -- the whole attempt ------------------------------------------------------------------

    def run(self) -> Outcome:
        try:
            supervise_objects.create_or_adopt(self)
        except Exception as exc:
            outcome = Outcome(
                OutcomeKind.FAILED,
                f"could not create the job's Kubernetes objects: {message_of(exc)}",
                restartable=False,
            )
            log.debug("create failed", exc_info=True)
            supervise_objects.delete_and_wait(self)
            return outcome
        self._start_watches()
        try:
            outcome = self._follow()
            supervise_logs.drain_logs(self, outcome)
            if outcome.kind == OutcomeKind.SUCCEEDED and self.result_refused:
                outcome = Outcome(OutcomeKind.FAILED, self.result_refused, 0, restartable=False)
            supervise_logs.blame_packed_rank(self, outcome)
        finally:
            supervise_objects.delete_and_wait(self)
            self._stop()
        supervise_objects.settle_ranks(self, outcome)
        return outcome

    # -- watches --------------------------------------------------------------------------------

    def _start_watches(self) -> None:
        """Two list-then-watch threads (kubeconn's: reconnects wait the one backoff policy,
        an outage is logged once with a count), feeding the event queue."""
        run, put = self.run_, self.events.put
        watches = (
            ("job", run.kind, {"fieldSelector": f"metadata.name={run.name}"}),
            ("pod", kind_of("v1", "Pod"), {"labelSelector": job_selector(self.ctx.job.id)}),
        )
        for name, kind, query in watches:
            watch = kubeconn.ConnectionListWatch(
                run.conn,
                kind.path(self.plan.namespace),
                query,
                f"the job's {name}s",
                lambda items, n=name: put((f"{n}_list", items)),
                lambda change, obj, n=name: put(
                    (f"{n}_deleted" if change == "DELETED" else n, obj)
                ),
                self._stopping,
                failures=WATCH_FAILURES,
                on_error=lambda exc, n=name: put(("watch_error", n, exc)),
            )
            thread = threading.Thread(target=watch.run, name=f"watch-{name}s", daemon=True)
            thread.start()
            self.watches.append((watch, thread))

    def _stop(self) -> None:
        if self.watches:
            self._stopping.set()
            for watch, _ in self.watches:
                watch.interrupt()
            for _, thread in self.watches:
                thread.join(5)
        for follower in list(self.followers.values()):
            follower.stop()

    # -- following --------------------------------------------------------------------------

    def _follow(self) -> Outcome:
        ctx, spec = self.ctx, self.spec
        changed = True
        while True:
            stop = lifecycle.stop_requested(ctx) or self.stalled
            if stop is not None:
                if stop.where is None:  # (a stall's were taken when it was seen)
                    stop.where = self.forensics.before_stop(str(stop.kind)) or None
                self.forensics.stopping = True
                return stop  # (the objects are deleted on the way out: run's finally)
            if self.job is None or (self.job.get("metadata") or {}).get("deletionTimestamp"):
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
                if self.held_reason is not None:
                    self.ctx.set_reason(self._held_reason())
                elif self.queued_reason is not None:
                    self.ctx.set_reason(self._queued_reason())
            supervise_logs.ensure_log_streams(self)
            changed = self._pump(LOOP_TICK)

    def _mine(self, pod: dict[str, Any]) -> bool:
        """One of this attempt's pods (not a leftover of an earlier one)."""
        return pod_belongs(
            pod,
            engine=self.plan.engine,
            owner_uid=self.uid,
            name=self.run_.name,
            attempt=str(self.number),
        )

    def _observe(self) -> Observation:
        return observe(
            self.job,
            self.pods.values(),
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
        if obs.suspended:
            self.held_reason = obs.reason
            ctx.set_reason(self._held_reason())
        else:
            if self.held_reason is not None:
                self.kueue_standing = None  # admitted: a later hold is looked at afresh
                if self.kueue is not None:
                    self.kueue.next_look = 0.0
            self.held_reason = None
            self.admitted_once = self.admitted_once or self.job is not None
            waiting = self.volcano is not None and obs.state == JobState.QUEUED
            self.queued_reason = obs.reason if waiting else None
            ctx.set_reason(self._queued_reason() if waiting else obs.reason or self._installing())

    def _installing(self) -> str | None:
        """While pods install the notebook's packages (before their ranks run)."""
        waiting = sorted(self.installing - self.started_ranks)
        if not waiting:
            return None
        count = len(self.plan.packages.get("requirements") or []) if self.plan.packages else 0
        ranks = ", ".join(map(str, waiting[:8])) + (", ..." if len(waiting) > 8 else "")
        return f"installing {count} package(s) the notebook added (rank {ranks})"

    def _queued_reason(self) -> str | None:
        """A waiting Volcano-gang job's reason: its PodGroup's word first (what `mlcluster
        jobs` has room for), then what its pods say. Re-read with kueue's backoff."""
        if self.volcano is not None and self.job is not None:
            text = self.volcano.look()
            if text is not False:
                self.volcano_text = text
        if self.volcano_text:
            return f"{self.volcano_text} ({self.queued_reason})"
        return self.queued_reason

    def _held_reason(self) -> str | None:
        """The reason of a suspended job: where it stands in Kueue when Kueue says, and
        whether it was preempted (suspended again after Kueue had admitted it)."""
        if self.kueue is not None and self.uid:
            standing = self.kueue.look(self.uid)
            if standing is not None:
                self.kueue_standing = standing
        if self.kueue_standing is not None:
            return standing_text(self.kueue_standing, preempted=self.admitted_once)
        if self.admitted_once and self.plan.gang == "kueue":
            return f"preempted by Kueue (suspended again): {self.held_reason}"
        return self.held_reason

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
        items = _quietly(
            lambda: (
                pod_metrics(self.plan.namespace, label_selector=job_selector(self.ctx.job.id)).items
            ),
            [],
        )
        usage: dict[int, dict[str, Any]] = {}
        for item in items:
            pod = self.pods.get((item.get("metadata") or {}).get("name", ""))
            if pod is None or not self._mine(pod):
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
        for _ in range(1000):  # then let the loop look at states again
            self._handle(item)
            try:
                item = self.events.get_nowait()
            except queue.Empty:
                break
        return True

    def _handle(self, item: tuple) -> None:
        what = item[0]
        if what == "job":
            obj = item[1]
            if obj["metadata"].get("uid") == self.uid:
                self.job = obj
        elif what == "job_deleted":
            if item[1]["metadata"].get("uid") == self.uid:
                self.job = None
        elif what == "pod":
            self.pods[item[1]["metadata"]["name"]] = item[1]
        elif what == "pod_deleted":
            self.pods.pop(item[1]["metadata"]["name"], None)
        elif what == "job_list":  # a (re)list: what is not in it is gone
            mine = [o for o in item[1] if o["metadata"].get("uid") == self.uid]
            self.job = mine[0] if mine else None
        elif what == "pod_list":
            self.pods = {o["metadata"]["name"]: o for o in item[1]}
        elif what == "log":
            _, pod, data = item
            self.log_failures.pop(pod, None)  # it streams again
            output = self.outputs.get(pod)
            if output is not None:
                for rank, kind, value in output.feed(data):
                    self.rank_item(rank, kind, value)
        elif what == "log_end":
            supervise_logs.log_ended(self, item[1], item[2])
        elif what == "watch_error":
            self._watch_error(item[1], item[2])

    def rank_item(self, rank: int, kind: str, value: Any) -> None:
        """A rank's line or record from its pod log (a session's attempt serves cells)."""
        supervise_logs.rank_item(self, rank, kind, value)

    def _watch_error(self, what: str, exc: BaseException) -> None:
        text = message_of(exc)
        if text not in self.reported_watch_errors:
            self.reported_watch_errors.add(text)
            self.ctx.logs.system(
                f"[mlcluster] watching the job's {what}s failed ({text}); retrying"
            )
