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
"""

from __future__ import annotations

import base64
import functools
import json
import logging
import os
import queue
import threading
import time
from typing import TYPE_CHECKING, Any

from ... import kubeconn
from ...jobs import lifecycle
from ...jobs.lifecycle import Outcome
from ...jobs.model import JobSpec, JobState, RankState
from ...jobs.store import JobStore
from ...runtime.protocol import job_key, key_path
from ...runtime.sync_packages import describe
from .cleanup import pending_cleanup, set_pending_cleanup
from .client import (
    Connection,
    KubeError,
    Resources,
    is_already_exists,
    kind_of,
    message_of,
    served_kinds,
    with_retries,
)
from .kueue import KueueView, Standing, standing_text
from .logs import PodLogFollower, PodOutput, stored_line_counts
from .objects import (
    ANNOTATION_ATTEMPT,
    container_name,
    job_selector,
    object_name,
    pod_ranks,
    with_owner,
)
from .packages import PackageSync
from .payload import split_payload
from .plan import JobPlan, plan_objects
from .status import (
    Observation,
    container_phase,
    is_suspended,
    later_rank_state,
    observe,
    owned_by,
    pod_belongs,
    pod_usage,
    rank_fields,
)
from .volcano import PodGroupView

if TYPE_CHECKING:
    from ...jobs.supervisor import JobContext

log = logging.getLogger("jupyterlab_mlcluster.supervisor")
WATCH_FAILURES = kubeconn.FailureLog(log)  # an outage: one line, then a count a minute
DELETE_FAILURES = kubeconn.FailureLog(log)

LOOP_TICK = 0.05
LOG_DRAIN_TIMEOUT = 10.0  # after the outcome: how long to wait for the last log lines
# Before re-opening a log stream that ended early or failed: the one policy, with a lower cap
# so that lines written during an outage are read before the drain after the outcome ends.
LOG_BACKOFF = kubeconn.Backoff(first=kubeconn.backoff_from_env().first, cap=10.0)
LOG_FAILURES_REPORTED = 3  # failures in a row before the user hears of it
METRICS_API_INTERVAL = 5.0  # metrics-server scrapes every 15 s by default; no use asking often
DEPENDENT_RETRY_TIMEOUT = 30.0  # for a same-named leftover of an earlier attempt to be collected
VERIFY_GONE_INTERVAL = 2.0

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


def _write_atomically(path, data: bytes) -> None:
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


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
        self.result_refused: str | None = None  # why rank 0's result was dropped
        self.result_received = 0  # base64 characters of result chunks held
        self.json_form_refused = False  # rank 0's JSON form was over max_result_json_mib
        self.runtime_metrics: dict[int, dict[str, Any]] = {}
        self.rank_updates = lifecycle.RankUpdates(run.ctx)
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

    # -- the whole attempt ------------------------------------------------------------------

    def run(self) -> Outcome:
        try:
            self._create_or_adopt()
        except Exception as exc:
            outcome = Outcome(
                "failed",
                f"could not create the job's Kubernetes objects: {message_of(exc)}",
                restartable=False,
            )
            log.debug("create failed", exc_info=True)
            self._delete_and_wait()
            return outcome
        self._start_watches()
        try:
            outcome = self._follow()
            self._drain_logs(outcome)
            if outcome.kind == "succeeded" and self.result_refused:
                outcome = Outcome("failed", self.result_refused, 0, restartable=False)
            self._blame_packed_rank(outcome)
        finally:
            self._delete_and_wait()
            self._stop()
        self._settle_ranks(outcome)
        return outcome

    # -- create or adopt --------------------------------------------------------------------

    def _create_or_adopt(self) -> None:
        run, ctx, plan = self.run_, self.ctx, self.plan
        existing = with_retries(lambda: run.res.get(run.kind, run.name), f"get {run.name}")
        if existing is not None and not self._ours(existing):
            if pending_cleanup(ctx.job) is not None:
                # An earlier supervisor of this very attempt was deleting it: the outcome
                # is not known, and running the job again is not ours to decide.
                raise KubeError(
                    f"{plan.kind} {run.name} was being deleted when the job's supervisor died"
                )
            self._wait_gone(existing)
            existing = None
        if existing is not None:
            self.adopted_skip = stored_line_counts(ctx.store, ctx.job.id, self.spec.workers)
            ctx.logs.system(
                f"[mlcluster] supervisor restarted: following {plan.kind} {run.name} again"
            )
            job = existing
        else:
            job = None
        objects = plan_objects(
            plan,
            ctx.job.id,
            self.spec,
            user=ctx.job.owner or "unknown",
            payload_chunks=split_payload(ctx.store.payload_path(ctx.job.id).read_bytes()),
            attempt=self.number,
            report_key=run.key,
        )
        if job is None:
            log.debug("creating %s %s", plan.kind, run.name)
            job = self._create(objects.job)
            if self.number == 0:
                self._say_packages()
        self.job, self.uid = job, job["metadata"]["uid"]
        for dependent in objects.dependents:
            self._create_dependent(with_owner(dependent, job))
        self._check_secrets(objects.dependents)
        if objects.resume is not None and is_suspended(job, plan.engine):
            self.job = with_retries(self._resume(objects.resume), f"resume {run.name}")
        log.debug("objects ready")

    def _say_packages(self) -> None:
        """What the pods will install first (the notebook's packages), and any caveat."""
        sync = PackageSync.from_dict(self.plan.packages)
        if sync is None or not sync.requirements:
            return
        source = "the wheel cache" if sync.cache_claim else "the package index"
        self.ctx.logs.system(
            f"[mlcluster] each pod first installs {describe(list(sync.requirements))}, "
            f"installed in the notebook since its pod started, from {source} "
            "(--no-sync-packages: not)"
        )
        for note in sync.notes:
            self.ctx.logs.system(f"[mlcluster] {note}")

    def _ours(self, obj: dict[str, Any]) -> bool:
        """This attempt's object, alive (adopt it), not an earlier attempt's or one being
        deleted."""
        meta = obj.get("metadata") or {}
        return not meta.get("deletionTimestamp") and (meta.get("annotations") or {}).get(
            ANNOTATION_ATTEMPT
        ) == str(self.number)

    def _create(self, obj: dict[str, Any]) -> dict[str, Any]:
        res = self.run_.res

        def create() -> dict[str, Any]:
            try:
                return res.create(obj)
            except Exception as exc:
                if is_already_exists(exc):  # our own earlier try went through after all
                    found = res.get(kind_of(obj), obj["metadata"]["name"])
                    if found is not None and self._ours(found):
                        return found
                raise

        return with_retries(create, f"create {obj['kind']} {obj['metadata']['name']}")

    def _create_dependent(self, obj: dict[str, Any]) -> None:
        """Create an owned object; a same-named one of ours is fine, a leftover of an earlier
        attempt (another owner, being garbage-collected) is waited out."""
        res, kind, name = self.run_.res, kind_of(obj), obj["metadata"]["name"]
        deadline = time.monotonic() + DEPENDENT_RETRY_TIMEOUT
        while True:
            try:
                created = with_retries(lambda: res.create(obj), f"create {obj['kind']} {name}")
                if kind.kind == "Secret":
                    self._record_secret(name, created["metadata"]["uid"])
                return
            except Exception as exc:
                if not is_already_exists(exc):
                    raise
            if kind.kind == "Secret":
                # Ours only if this job's supervisor recorded creating it (one that died
                # mid-way did); else someone else's, holding who knows what code.
                if name in self._secret_uids():
                    return
                raise KubeError(
                    f"Secret {name} already exists and was not created by this job: "
                    "refusing to run the code it holds"
                )
            found = res.get(kind, name)
            if found is not None and owned_by(found, self.uid or ""):
                return
            if time.monotonic() > deadline:
                raise KubeError(f"{obj['kind']} {name} exists and belongs to something else")
            time.sleep(0.2)

    def _secrets_file(self):
        return self.ctx.store.job_dir(self.ctx.job.id) / "payload-secrets.json"

    def _secret_uids(self) -> dict[str, str]:
        """name -> uid of every payload Secret this job's supervisors created."""
        try:
            return json.loads(self._secrets_file().read_text())
        except (OSError, ValueError):
            return {}

    def _record_secret(self, name: str, uid: str) -> None:
        uids = self._secret_uids()
        uids[name] = uid
        _write_atomically(self._secrets_file(), json.dumps(uids).encode())

    def _check_secrets(self, dependents: list[dict[str, Any]]) -> None:
        """Before any pod mounts them: each payload Secret is still the one created here
        (same uid; a deleted-and-recreated one is not). Asked as a dry-run delete with a uid
        precondition, so the runner needs no right to read Secrets."""
        uids = self._secret_uids()
        for obj in dependents:
            if obj["kind"] != "Secret":
                continue
            name = obj["metadata"]["name"]
            uid = uids.get(name)
            if uid is None or not with_retries(
                functools.partial(self._holds_secret, name, uid), f"check Secret {name}"
            ):
                raise KubeError(
                    f"Secret {name} is no longer the one this job created: refusing to run "
                    "the code it holds"
                )

    def _holds_secret(self, name: str, uid: str) -> bool:
        return self.run_.res.holds(kind_of("v1", "Secret"), name, uid)

    def _resume(self, patch: dict[str, Any]):
        res, kind, name, engine = self.run_.res, self.run_.kind, self.run_.name, self.plan.engine
        tries = 0

        def resume() -> dict[str, Any]:
            nonlocal tries
            tries += 1
            if tries > 1:  # after a conflict: re-read, someone else may have moved it on
                current = res.get(kind, name)
                if current is None:
                    raise KubeError(f"{kind.kind} {name} disappeared before it could start")
                if not is_suspended(current, engine):
                    return current
            return res.patch(kind, name, patch)

        return resume

    def _wait_gone(self, obj: dict[str, Any]) -> None:
        """An earlier attempt's object: delete it (if nobody is) and wait until it is gone."""
        res, kind, name = self.run_.res, self.run_.kind, self.run_.name
        if not (obj.get("metadata") or {}).get("deletionTimestamp"):
            with_retries(lambda: res.delete(kind, name), f"delete {kind.kind} {name}")
        deadline = time.monotonic() + self.ctx.config.kubernetes_delete_timeout
        while with_retries(lambda: res.get(kind, name), f"get {name}") is not None:
            if time.monotonic() > deadline:
                raise KubeError(f"{kind.kind} {name} of an earlier attempt is still being deleted")
            self.ctx.tick()
            time.sleep(0.1)

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
            reason = ctx.cancelled()
            if reason:
                return Outcome("cancelled", reason)
            if spec.timeout and ctx.job.started and time.time() > ctx.job.started + spec.timeout:
                return Outcome(
                    "timeout", f"timed out after {lifecycle.format_duration(spec.timeout)}"
                )
            if self.job is None or (self.job.get("metadata") or {}).get("deletionTimestamp"):
                return Outcome(
                    "failed",
                    f"the {self.plan.kind} {self.run_.name} was deleted outside mlcluster",
                    restartable=True,
                )
            if changed:
                obs = self._observe()
                self._report(obs)
                if obs.failure is not None:
                    if obs.failure.deadline:
                        return Outcome(
                            "timeout",
                            f"timed out after {lifecycle.format_duration(spec.timeout or 0)}",
                        )
                    return Outcome("failed", obs.failure.message, obs.failure.rank, obs.failure.pod)
                if obs.succeeded:
                    return Outcome("succeeded")
            else:
                self._flush()
                if self.held_reason is not None:
                    self.ctx.set_reason(self._held_reason())
                elif self.queued_reason is not None:
                    self.ctx.set_reason(self._queued_reason())
            self._ensure_log_streams()
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
                    self._rank_item(rank, kind, value)
        elif what == "log_end":
            self._log_ended(item[1], item[2])
        elif what == "watch_error":
            self._watch_error(item[1], item[2])

    def _watch_error(self, what: str, exc: BaseException) -> None:
        text = message_of(exc)
        if text not in self.reported_watch_errors:
            self.reported_watch_errors.add(text)
            self.ctx.logs.system(
                f"[mlcluster] watching the job's {what}s failed ({text}); retrying"
            )

    # -- logs -----------------------------------------------------------------------------------

    def _ensure_log_streams(self) -> None:
        now = time.monotonic()
        for name, pod in self.pods.items():
            if name in self.followers or name in self.log_done or not self._mine(pod):
                continue
            if (
                self.log_retry_at.get(name, 0.0) > now
                or container_phase(pod, self.container) == "waiting"
            ):
                continue
            ranks = pod_ranks(pod, self.plan.engine, self.plan.ranks_per_pod)
            if not ranks:
                continue
            skip = self.resume_skip.pop(name, None)
            if skip is None:
                skip = {r: self.adopted_skip.get(r, 0) for r in ranks}
            self.outputs[name] = PodOutput(ranks, skip, key=self.run_.key)
            self.followers[name] = PodLogFollower(
                self.run_.conn, self.plan.namespace, name, self.container, self.events
            ).start()

    def _log_ended(self, pod_name: str, error: BaseException | None) -> None:
        self.followers.pop(pod_name, None)
        output = self.outputs.pop(pod_name, None)
        if output is None:
            return
        for rank, kind, value in output.finish():
            self._rank_item(rank, kind, value)
        pod = self.pods.get(pod_name)
        if pod is None or (error is None and container_phase(pod, self.container) == "terminated"):
            self.log_done.add(pod_name)
            return
        # Ended early (a dropped connection, or our view of the pod is behind): read it
        # again later, skipping what we already have.
        self.resume_skip[pod_name] = output.seen()
        failures = self.log_failures[pod_name] = self.log_failures.get(pod_name, 0) + (
            error is not None
        )
        if failures == LOG_FAILURES_REPORTED and error is not None:
            self.ctx.logs.system(
                f"[mlcluster] cannot read the log of pod {pod_name}: {message_of(error)}"
            )
        delay = LOG_BACKOFF.delay(failures, getattr(error, "retry_after", None))
        self.log_retry_at[pod_name] = time.monotonic() + delay

    def _rank_item(self, rank: int, kind: str, value: Any) -> None:
        if kind == "line":
            self.ctx.logs.line(rank, "o", value)
        elif kind == "progress":
            self._rank_update(rank, {"progress": lifecycle.clean_progress(value)})
        elif kind == "control":
            self._control(rank, value)

    def _control(self, rank: int, record: dict[str, Any]) -> None:
        rtype = record.get("type")
        job_id = self.ctx.job.id
        if rtype == "started":
            self.started_ranks.add(rank)
            state = self.written.get(rank, {}).get("state", RankState.PENDING)
            if not RankState(state).final:
                self._rank_update(rank, {"state": RankState.RUNNING})
        elif rtype == "progress":
            self._rank_update(rank, {"progress": lifecycle.clean_progress(record)})
        elif rtype == "metrics":
            self.runtime_metrics[rank] = {
                k: record.get(k)
                for k in ("cpu_percent", "memory_bytes", "gpu_util", "gpu_memory_bytes")
            }
        elif rtype == "error":
            report = {k: v for k, v in record.items() if k != "type"}
            _write_atomically(self.ctx.store.error_path(job_id, rank), json.dumps(report).encode())
        elif rtype == "result" and rank == 0:  # a result comes from rank 0 or from nobody
            self._result_chunk(record)
        elif rtype == "packages":  # the pod installs the notebook's packages (its log says more)
            if record.get("state") == "installing":
                self.installing.add(rank)
            else:
                self.installing.discard(rank)

    def _result_chunk(self, record: dict[str, Any]) -> None:
        """Rank 0's result in chunks: the pickle (its owner's kernel reads it) and its JSON
        form (what servers serve); neither is ever loaded here. More than the job's result cap
        is dropped as it comes (a pod cannot fill this process's memory) and fails the job."""
        if self.result_refused:
            return
        form = "json" if record.get("form") == "json" else "pickle"
        if form == "json" and self.json_form_refused:
            return
        chunks = self.result_chunks.setdefault(form, {})
        try:
            index, count = int(record["index"]), int(record["count"])
            data = str(record["data"])
        except (KeyError, TypeError, ValueError):
            return
        self.result_received += len(data) - len(chunks.get(index, ""))
        chunks[index] = data
        json_cap = self.ctx.config.max_result_json_mib * 1024 * 1024
        if form == "json" and json_cap:
            held = sum(len(c) for c in chunks.values())
            if held > json_cap * 4 // 3 + 4:
                # The JSON form is what servers read and serve, for everyone: it is kept small
                # whatever the rank says of itself. The job and its pickle go on.
                self.result_received -= held
                del self.result_chunks[form]
                self.json_form_refused = True
                why = (
                    f"its JSON form is more than this job's supervisor keeps ({json_cap >> 20} "
                    "MiB, MLClusterConfig.max_result_json_mib)"
                )
                self.ctx.logs.system(f"[mlcluster] rank 0's result: {why}", rank=0)
                _write_atomically(
                    self.ctx.store.result_json_path(self.ctx.job.id),
                    json.dumps({"kind": "refused", "refused": why}).encode(),
                )
                return
        limit = self.ctx.config.max_result_mib * 1024 * 1024
        # base64 is 4/3 of the bytes; the JSON form may be as big as the pickle.
        if limit and self.result_received > 2 * (limit * 4 // 3 + 4):
            self.result_chunks = {}
            self.result_refused = (
                f"rank 0's result is more than this job may return ({limit // (1024 * 1024)} "
                "MiB, MLClusterConfig.max_result_mib): save it to a file instead"
            )
            self.ctx.logs.system(f"[mlcluster] {self.result_refused}", rank=0)
            return
        if 0 <= index < count <= len(chunks) and all(i in chunks for i in range(count)):
            result = base64.b64decode("".join(chunks[i] for i in range(count)))
            store = self.ctx.store
            path = store.result_json_path if form == "json" else store.result_path
            _write_atomically(path(self.ctx.job.id), result)
            self.result_received -= sum(len(c) for c in chunks.values())
            del self.result_chunks[form]

    def _drain_logs(self, outcome: Outcome) -> None:
        """The outcome is known; wait (a little) for the log lines that tell its story: all
        ranks' after a success (rank 0's result), the failing pod's after a failure."""
        if outcome.kind == "succeeded":
            wanted = {n for n, p in self.pods.items() if self._mine(p)}
        elif outcome.kind == "failed" and outcome.failed_pod:
            wanted = {outcome.failed_pod}
        else:
            wanted = set()
        deadline = time.monotonic() + LOG_DRAIN_TIMEOUT
        while True:
            waiting = {
                n
                for n in wanted
                if n in self.followers
                or (
                    n not in self.log_done
                    and n in self.pods
                    and container_phase(self.pods[n], self.container) != "waiting"  # no logs ever
                )
            }
            if not waiting or time.monotonic() > deadline:
                break
            self._ensure_log_streams()
            self._pump(LOOP_TICK)
            self.ctx.tick()
        if self.result_chunks:
            self.ctx.logs.system("[mlcluster] rank 0's result did not arrive completely", rank=0)
        self._flush(force=True)

    def _blame_packed_rank(self, outcome: Outcome) -> None:
        """In a pod of several ranks, the failing one is the one that reported an error."""
        pod = self.pods.get(outcome.failed_pod or "")
        if pod is None or self.plan.ranks_per_pod == 1:
            return
        for rank in pod_ranks(pod, self.plan.engine, self.plan.ranks_per_pod):
            if self.ctx.store.error_path(self.ctx.job.id, rank).exists():
                outcome.failed_rank = rank
                return

    # -- the end ------------------------------------------------------------------------------

    def _delete_and_wait(self) -> None:
        """Delete the job object (foreground: its pods, Secrets, Service, PodGroup go first)
        and wait until it and every pod of the job are gone.

        The delete must happen: it is retried with the one backoff policy until the API
        server accepts it, however long that takes. The job records it as a pending cleanup
        first, so if this supervisor dies meanwhile, the next one or the reaper finishes it."""
        run, ctx = self.run_, self.ctx
        set_pending_cleanup(ctx.store, ctx.job.id, True)
        told = False

        def delete() -> bool:
            nonlocal told
            try:
                return run.res.delete(run.kind, run.name)
            except Exception as exc:
                if kubeconn.retryable(exc) and not told:
                    told = True
                    ctx.logs.system(
                        f"[mlcluster] cannot delete {run.kind.kind} {run.name} yet "
                        f"({message_of(exc)}); retrying until it is gone"
                    )
                raise

        try:
            kubeconn.call(
                delete,
                f"delete {run.kind.kind} {run.name}",
                give_up_after=None,
                sleep=self._wait_ticking,
                failures=DELETE_FAILURES,
            )
        except Exception as exc:  # noqa: BLE001 - not retryable (e.g. forbidden): say so
            ctx.logs.system(
                f"[mlcluster] could not delete {run.kind.kind} {run.name}: {message_of(exc)}; "
                "the reaper tries again"
            )
            return
        if told:
            ctx.logs.system(f"[mlcluster] {run.kind.kind} {run.name} deleted")
        deadline = time.monotonic() + ctx.config.kubernetes_delete_timeout
        next_check = time.monotonic() + VERIFY_GONE_INTERVAL
        while time.monotonic() < deadline:
            if (
                not self.watches
                or (self.job is None and not self.pods)
                or time.monotonic() > next_check
            ):
                next_check = time.monotonic() + VERIFY_GONE_INTERVAL
                if self._gone():
                    set_pending_cleanup(ctx.store, ctx.job.id, False)
                    self._flush(force=True)
                    return
            self._pump(LOOP_TICK)
            self._ensure_log_streams()
            self._flush()
        # The deletion was accepted: Kubernetes finishes it (the cleanup stays pending for
        # the reaper, which checks that it did).
        ctx.logs.system(
            f"[mlcluster] {run.kind.kind} {run.name} or its pods were still being deleted after "
            f"{ctx.config.kubernetes_delete_timeout:g}s; Kubernetes finishes that on its own"
        )

    def _wait_ticking(self, seconds: float) -> None:
        """Sleep between retries, keeping the heartbeat (this supervisor is alive)."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            self.ctx.tick()
            time.sleep(min(left, 0.5))

    def _gone(self) -> bool:
        """Ask the API server directly (the watches may be behind or not started); an
        unreachable server means: not known to be gone yet."""
        run = self.run_
        try:
            if run.res.get(run.kind, run.name) is not None:
                return False
            pods = run.res.list(kind_of("v1", "Pod"), label_selector=job_selector(self.ctx.job.id))
        except KubeError as exc:
            DELETE_FAILURES.failed(f"check that {run.name} is gone", exc)
            return False
        return not pods

    def _settle_ranks(self, outcome: Outcome) -> None:
        """Ranks that did not finish were stopped by us (fail-fast, cancel, timeout)."""
        now = time.time()
        for rank in range(self.spec.workers):
            state = RankState(self.written.get(rank, {}).get("state", RankState.PENDING))
            if not state.final:
                self._rank_update(rank, {"state": RankState.CANCELLED, "finished": now})
        self._flush(force=True)
