"""What the cluster says about a job, in mlcluster's words: pure functions, dicts in.

`observe(job_object, pods, ...)` reads the job object (Indexed Job or Training Operator
conditions) and its pods (phase, PodScheduled condition, container states) and returns the
job state, a readable reason while it waits, each rank's state, and whether it has
succeeded or failed (and which rank failed, and how).

Gang semantics: a job is `queued` while any rank has no pod yet, a pod cannot be scheduled,
or the job object is suspended (Kueue); `starting` once every pod is placed and containers
are being created; `running` once every rank runs (or has already finished).
"""

from __future__ import annotations

import dataclasses
import datetime
import signal
from collections.abc import Iterable
from typing import Any

from ...jobs.model import JobState, RankState
from .objects import ANNOTATION_ATTEMPT, container_name, pod_ranks
from .trainjob import ATTEMPT_LABEL, JOBSET_NAME_LABEL, NODE

# Container waiting reasons that will not fix themselves quickly: shown to the user.
STUCK_WAITING = frozenset(
    {
        "ErrImagePull",
        "ImagePullBackOff",
        "InvalidImageName",
        "CreateContainerConfigError",
        "CreateContainerError",
        "CrashLoopBackOff",
        "RunContainerError",
    }
)
_RANK_ORDER = {
    RankState.PENDING: 0,
    RankState.STARTING: 1,
    RankState.RUNNING: 2,
    RankState.SUCCEEDED: 3,
    RankState.FAILED: 3,
    RankState.CANCELLED: 3,
}


@dataclasses.dataclass
class PodRank:
    """One pod's story, for every rank it runs."""

    pod: str
    state: RankState
    exit_code: int | None = None
    started: float | None = None
    finished: float | None = None
    waiting: str | None = None  # why a pending/starting pod waits, readable
    unschedulable: bool = False
    terminated_reason: str | None = None  # OOMKilled, Error, DeadlineExceeded, Evicted...
    # Why Kubernetes took the pod away (its DisruptionTarget condition), readable.
    disruption: str | None = None

    @property
    def final(self) -> bool:
        return self.state.final


@dataclasses.dataclass
class Failure:
    rank: int | None
    message: str
    exit_code: int | None = None
    pod: str | None = None
    deadline: bool = False  # Kubernetes stopped it at activeDeadlineSeconds (the timeout)
    disrupted: bool = False  # the pod was taken away (evicted, preempted): no rank's fault


@dataclasses.dataclass
class Observation:
    state: JobState  # queued, starting or running while not over
    reason: str | None
    ranks: dict[int, PodRank]  # ranks that have a pod
    suspended: bool = False
    succeeded: bool = False
    failure: Failure | None = None


def parse_time(text: str | None) -> float | None:
    if not text:
        return None
    try:
        return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _condition(obj: dict[str, Any], kind: str) -> dict[str, Any] | None:
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind:
            return cond
    return None


# DisruptionTarget reasons (Kubernetes 1.26+) in words.
_DISRUPTIONS = {
    "EvictionByEvictionAPI": "evicted (Eviction API)",
    "PreemptionByScheduler": "preempted by the scheduler",
    "PreemptionByKubeScheduler": "preempted by the scheduler",
    "DeletionByTaintManager": "deleted: its node is tainted (NoExecute)",
    "DeletionByPodGC": "deleted: its node is gone",
    "TerminationByKubelet": "terminated by the kubelet (node pressure or shutdown)",
}


def disruption(pod: dict[str, Any]) -> str | None:
    """Why Kubernetes took the pod away, from its DisruptionTarget condition; None if it
    did not: 'evicted (Eviction API): Eviction API: evicting'."""
    cond = _true(pod, "DisruptionTarget")
    if cond is None:
        return None
    reason = cond.get("reason") or ""
    text = _DISRUPTIONS.get(reason, f"taken away ({reason})" if reason else "taken away")
    return f"{text}: {cond['message']}" if cond.get("message") else text


def _true(obj: dict[str, Any], kind: str) -> dict[str, Any] | None:
    cond = _condition(obj, kind)
    return cond if cond is not None and cond.get("status") == "True" else None


def is_suspended(job: dict[str, Any], engine: str) -> bool:
    spec = job.get("spec") or {}
    if engine in ("indexed-job", "trainjob"):
        return bool(spec.get("suspend"))
    return bool((spec.get("runPolicy") or {}).get("suspend"))


def owned_by(obj: dict[str, Any], owner_uid: str) -> bool:
    return any(
        ref.get("uid") == owner_uid
        for ref in (obj.get("metadata") or {}).get("ownerReferences") or []
    )


def pod_belongs(
    pod: dict[str, Any], *, engine: str, owner_uid: str | None, name: str, attempt: str | None
) -> bool:
    """Whether a pod is one of this attempt's job object's. Pods of the other engines are
    owned by it; a TrainJob's are owned by a Job of its JobSet, so they are known by the
    JobSet's name label and the attempt label we put on them (runtimePatches)."""
    if engine == "trainjob":
        labels = (pod.get("metadata") or {}).get("labels") or {}
        return (
            labels.get(JOBSET_NAME_LABEL) == name
            and attempt is not None
            and labels.get(ATTEMPT_LABEL) == attempt
        )
    return owner_uid is not None and owned_by(pod, owner_uid)


# --- pods -------------------------------------------------------------------------------------


def _container_status(pod: dict[str, Any], name: str) -> dict[str, Any] | None:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    for status in statuses:
        if status.get("name") == name:
            return status
    return statuses[0] if statuses else None


def container_phase(pod: dict[str, Any], name: str) -> str:
    """'waiting', 'running' or 'terminated' (what a log request can expect)."""
    status = _container_status(pod, name)
    state = (status or {}).get("state") or {}
    for phase in ("terminated", "running", "waiting"):
        if state.get(phase) is not None:
            return phase
    pod_phase = (pod.get("status") or {}).get("phase", "Pending")
    return {"Pending": "waiting", "Running": "running"}.get(pod_phase, "terminated")


def pod_rank(pod: dict[str, Any], container: str) -> PodRank:
    """The state of the rank(s) one pod runs."""
    name = (pod.get("metadata") or {}).get("name", "")
    status = pod.get("status") or {}
    phase = status.get("phase") or "Pending"
    cstatus = _container_status(pod, container) or {}
    cstate = cstatus.get("state") or {}
    terminated = cstate.get("terminated")
    running = cstate.get("running")
    if phase in ("Succeeded", "Failed") or terminated is not None:
        term = terminated or {}
        code = term.get("exitCode")
        failed = phase == "Failed" or (code not in (None, 0))
        return PodRank(
            pod=name,
            state=RankState.FAILED if failed else RankState.SUCCEEDED,
            exit_code=code if failed else 0,
            started=parse_time(term.get("startedAt")),
            finished=parse_time(term.get("finishedAt")) or parse_time(status.get("startTime")),
            terminated_reason=term.get("reason") or status.get("reason"),
            waiting=status.get("message") if failed and not terminated else None,
            disruption=disruption(pod) if failed else None,
        )
    if phase == "Running" and running is not None:
        return PodRank(
            pod=name, state=RankState.RUNNING, started=parse_time(running.get("startedAt"))
        )
    scheduled = _condition(pod, "PodScheduled")
    if scheduled is not None and scheduled.get("status") == "False":
        why = scheduled.get("message") or scheduled.get("reason") or "not scheduled yet"
        return PodRank(
            pod=name,
            state=RankState.PENDING,
            waiting=why,
            unschedulable=scheduled.get("reason") == "Unschedulable",
        )
    if scheduled is None and not status.get("containerStatuses") and phase == "Pending":
        return PodRank(pod=name, state=RankState.PENDING)
    waiting = cstate.get("waiting") or {}
    stuck = None
    if waiting.get("reason") in STUCK_WAITING:
        stuck = f"{waiting['reason']}: {waiting.get('message') or ''}".rstrip(": ")
    state = RankState.RUNNING if phase == "Running" else RankState.STARTING
    return PodRank(pod=name, state=state, waiting=stuck)


def current_pods(
    pods: Iterable[dict[str, Any]],
    job: dict[str, Any] | None,
    engine: str,
    ranks_per_pod: int,
) -> dict[int, dict[str, Any]]:
    """rank -> the pod that runs it now: one of this attempt's job object's (`pod_belongs`),
    the newest if a controller replaced one."""
    meta = (job or {}).get("metadata") or {}
    chosen: dict[int, dict[str, Any]] = {}
    for pod in pods:
        if job is not None and not pod_belongs(
            pod,
            engine=engine,
            owner_uid=meta.get("uid"),
            name=meta.get("name", ""),
            attempt=(meta.get("annotations") or {}).get(ANNOTATION_ATTEMPT),
        ):
            continue
        created = (pod.get("metadata") or {}).get("creationTimestamp") or ""
        for rank in pod_ranks(pod, engine, ranks_per_pod):
            other = chosen.get(rank)
            if (
                other is None
                or (other.get("metadata") or {}).get("creationTimestamp", "") <= created
            ):
                chosen[rank] = pod
    return chosen


# --- the whole job ---------------------------------------------------------------------------


def observe(
    job: dict[str, Any] | None,
    pods: Iterable[dict[str, Any]],
    *,
    engine: str,
    workers: int,
    ranks_per_pod: int = 1,
    gang: str = "none",
    queue: str | None = None,
) -> Observation:
    container = container_name(engine)
    by_rank = current_pods(pods, job, engine, ranks_per_pod)
    ranks = {rank: pod_rank(pod, container) for rank, pod in by_rank.items()}
    obs = Observation(state=JobState.QUEUED, reason=None, ranks=ranks)
    if job is None:
        obs.reason = "waiting for the job object to be created"
        return obs

    # The first to fail is the cause. Kubernetes keeps times to the second, so a pod taken
    # away and a peer that stopped with it (on the same SIGTERM) often tie: the pod taken
    # away is the cause then.
    failed_ranks = sorted(
        (r for r, pr in ranks.items() if pr.state == RankState.FAILED),
        key=lambda r: (ranks[r].finished or float("inf"), ranks[r].disruption is None, r),
    )
    if failed_ranks:
        first = failed_ranks[0]
        pr = ranks[first]
        obs.failure = Failure(
            first,
            rank_failure_message(first, pr),
            pr.exit_code,
            pr.pod,
            disrupted=pr.disruption is not None,
        )
        return obs
    job_failed = _job_failed(job, engine)
    if job_failed is not None:
        obs.failure = Failure(None, job_failed[0], deadline=job_failed[1])
        return obs
    if _job_succeeded(job, engine) or (
        len(ranks) == workers and all(pr.state == RankState.SUCCEEDED for pr in ranks.values())
    ):
        obs.succeeded = True
        obs.state = JobState.RUNNING
        return obs

    counts = node_jobs_status(job) if engine == "trainjob" else None
    if is_suspended(job, engine):
        obs.suspended = True
        obs.reason = (
            f"waiting for Kueue to admit the job (queue {queue})"
            if gang == "kueue"
            else "the job is suspended"
        )
        return obs
    missing = [r for r in range(workers) if r not in ranks]
    pending = [r for r in range(workers) if r in ranks and ranks[r].state == RankState.PENDING]
    if missing or pending:
        obs.state = JobState.QUEUED
        obs.reason = _wait_reason(ranks, pending, missing, engine, workers)
        if counts is not None:  # first: it is what `mlcluster jobs` has room for
            obs.reason = f"{_jobs_status_text(counts)}; {obs.reason}"
        return obs
    starting = [r for r in range(workers) if ranks[r].state == RankState.STARTING]
    obs.state = JobState.STARTING if starting else JobState.RUNNING
    stuck = [r for r in range(workers) if ranks[r].waiting and not ranks[r].final]
    if stuck:
        obs.reason = f"{_ranks_text(stuck)} cannot start: {ranks[stuck[0]].waiting}"
    return obs


def _ranks_text(ranks: list[int]) -> str:
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    shown = ", ".join(str(r) for r in ranks[:5]) + (", ..." if len(ranks) > 5 else "")
    return f"{len(ranks)} ranks ({shown})"


def _wait_reason(
    ranks: dict[int, PodRank], pending: list[int], missing: list[int], engine: str, workers: int
) -> str:
    unschedulable = [r for r in pending if ranks[r].unschedulable or ranks[r].waiting]
    if unschedulable:
        first = ranks[unschedulable[0]]
        return (
            f"waiting for resources: {_ranks_text(unschedulable)} of {workers} cannot be "
            f"scheduled yet ({first.waiting})"
        )
    if missing and len(missing) == workers:
        creator = {
            "indexed-job": "the Job controller",
            "trainjob": "the Kubeflow Trainer (JobSet)",
        }.get(engine, "the Training Operator")
        return f"waiting for {creator} to create the pods"
    if missing:
        return f"waiting for the pods of {_ranks_text(missing)}"
    return f"waiting for {_ranks_text(pending)} to be scheduled"


def _job_succeeded(job: dict[str, Any], engine: str) -> bool:
    kind = "Complete" if engine in ("indexed-job", "trainjob") else "Succeeded"
    return _true(job, kind) is not None


def node_jobs_status(job: dict[str, Any]) -> dict[str, int] | None:
    """A TrainJob's `status.jobsStatus` entry for its `node` replicated job (the Trainer copies
    it from the JobSet): how many of its child Jobs are active/ready/succeeded/failed/suspended.
    None before the Trainer reports it. Counts are child Jobs, not pods."""
    for entry in (job.get("status") or {}).get("jobsStatus") or []:
        if isinstance(entry, dict) and entry.get("name") == NODE:
            return {
                key: int(entry.get(key) or 0)
                for key in ("active", "ready", "succeeded", "failed", "suspended")
            }
    return None


def _jobs_status_text(counts: dict[str, int]) -> str:
    """Where the Trainer's JobSet stands. A suspended count after our resume is the Trainer
    not yet having passed the resume on (Kueue's preemption suspends the TrainJob itself,
    which `is_suspended` sees), so it is said, not taken as a hold."""
    if counts["suspended"]:
        return "the Trainer has not resumed its JobSet yet"
    total = sum(counts[k] for k in ("active", "succeeded", "failed"))
    return f"JobSet node job: {counts['ready']} of {max(total, 1)} ready"


def _job_failed(job: dict[str, Any], engine: str) -> tuple[str, bool] | None:
    """(why the job object says it failed, whether it was its deadline), or None. A TrainJob's
    Failed condition is the final word; before the Trainer sets it, a failed child Job in
    `jobsStatus` already fails the job."""
    cond = _true(job, "Failed") or (
        _true(job, "FailureTarget") if engine == "indexed-job" else None
    )
    if cond is None and engine == "trainjob" and _condition(job, "Failed") is None:
        counts = node_jobs_status(job)
        if counts and counts["failed"]:
            failed = counts["failed"]
            return f"the Kubeflow Trainer reports {failed} failed node job(s) (jobsStatus)", False
    if cond is None:
        return None
    reason, message = cond.get("reason") or "", cond.get("message") or ""
    if reason == "DeadlineExceeded":
        return (
            "the job ran past its deadline (activeDeadlineSeconds) and was stopped by Kubernetes",
            True,
        )
    text = f"{reason}: {message}" if reason and message else (message or reason or "the job failed")
    return f"Kubernetes marked the job failed: {text}", False


def rank_failure_message(rank: int, pr: PodRank) -> str:
    """A failed rank in a sentence, from its pod (before its error report is known)."""
    code, reason = pr.exit_code, pr.terminated_reason
    if pr.disruption:
        return f"rank {rank}'s pod was {pr.disruption}"
    if reason == "OOMKilled":
        return f"rank {rank} was killed: out of memory (OOMKilled; ask for more with --memory)"
    if reason == "Evicted":
        return f"rank {rank}'s pod was evicted: {pr.waiting or 'node pressure'}"
    if code is not None and code > 128 and (code - 128) in signal.Signals._value2member_map_:
        return f"rank {rank} was killed by {signal.Signals(code - 128).name}"
    if code is None:
        return f"rank {rank}'s pod failed" + (f": {reason}" if reason else "")
    return f"rank {rank} exited with status {code}"


def rank_fields(pr: PodRank) -> dict[str, Any]:
    """A PodRank as the columns of the store's rank row."""
    return {
        "state": pr.state,
        "exit_code": pr.exit_code,
        "host": pr.pod,
        "started": pr.started,
        "finished": pr.finished if pr.final else None,
    }


def later_rank_state(a: RankState, b: RankState) -> RankState:
    """The further along of two states of one rank (a pod event and a log record can race)."""
    return b if _RANK_ORDER[b] > _RANK_ORDER[a] else a


# --- metrics API -----------------------------------------------------------------------------


def pod_usage(pod_metrics: dict[str, Any], container: str) -> dict[str, Any]:
    """metrics.k8s.io PodMetrics -> {cpu_percent, memory_bytes} of the rank container."""
    from kubernetes.utils import parse_quantity

    containers = pod_metrics.get("containers") or []
    chosen = [c for c in containers if c.get("name") == container] or containers[:1]
    if not chosen:
        return {}
    usage = chosen[0].get("usage") or {}
    result: dict[str, Any] = {}
    if "cpu" in usage:
        result["cpu_percent"] = round(float(parse_quantity(usage["cpu"])) * 100.0, 1)
    if "memory" in usage:
        result["memory_bytes"] = int(parse_quantity(usage["memory"]))
    return result
