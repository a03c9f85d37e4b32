"""A job as stored: JobRecord (+ RankRecord), and its JSON form (the REST/event shape)."""

from __future__ import annotations

import dataclasses
import datetime
import functools
import secrets
from typing import Any

from .grouping import parent_of
from .model import JobSpec, JobState, RankState

# What a tracked job's `tracking` shows (the record keeps the experiment's id too).
TRACKING_FIELDS = ("kind", "uri", "run_id", "url", "state", "message")


def new_job_id() -> str:
    # Starts with a letter: ids also name Kubernetes objects.
    return "j" + secrets.token_hex(5)


def iso(ts: float | None) -> str | None:
    """Epoch seconds -> RFC 3339 UTC with milliseconds ('2026-11-22T01:02:03.123Z')."""
    if ts is None:
        return None
    return _iso(ts)


# A listing of 100 jobs formats ~800 timestamps, the same ones on every request for jobs
# that have ended: remembered (a pure function), not formatted again (GET /jobs).
@functools.lru_cache(maxsize=1 << 15)
def _iso(ts: float) -> str:
    # isoformat, not strftime: a third of the time; "+00:00" -> "Z".
    moment = datetime.datetime.fromtimestamp(ts, tz=datetime.UTC)
    return moment.isoformat(timespec="milliseconds").removesuffix("+00:00") + "Z"


@dataclasses.dataclass
class RankRecord:
    rank: int
    state: RankState = RankState.PENDING
    exit_code: int | None = None
    pid: int | None = None
    host: str | None = None
    started: float | None = None
    finished: float | None = None
    metrics: dict[str, Any] = dataclasses.field(default_factory=dict)
    progress: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "state": str(self.state),
            "exit_code": self.exit_code,
            "pid": self.pid,
            "host": self.host,
            "started": iso(self.started),
            "finished": iso(self.finished),
            "metrics": {
                "cpu_percent": self.metrics.get("cpu_percent"),
                "memory_bytes": self.metrics.get("memory_bytes"),
                "gpu_util": self.metrics.get("gpu_util"),
                "gpu_memory_bytes": self.metrics.get("gpu_memory_bytes"),
            },
            "progress": self.progress,
        }


@dataclasses.dataclass
class JobRecord:
    id: str
    name: str
    spec: JobSpec
    state: JobState = JobState.QUEUED
    created: float = 0.0
    started: float | None = None
    finished: float | None = None
    error: str | None = None
    failed_rank: int | None = None
    reason: str | None = None  # why it is where it is (e.g. "waiting for 4 CPU slots")
    restarts: int = 0
    cancel_requested: bool = False
    owner: str | None = None
    origin: dict[str, Any] = dataclasses.field(default_factory=dict)
    has_result: bool = False
    queue_position: int | None = None
    # Since when every GPU of the running job has been idle, once that lasted
    # MLClusterConfig.idle_gpu_after (jobs/running/gpu_idle.py); None otherwise.
    gpu_idle_since: float | None = None
    # While ranks are stalled (jobs/forensics/stall.py): {"ranks": [...], "since": epoch,
    # "where": [folded stacks' lines]}; None otherwise.
    stall: dict[str, Any] | None = None
    # While ranks straggle (jobs/forensics/straggler.py): {"ranks": [...], "since": epoch,
    # "rates": {"rank": steps/s}, "median": steps/s}; None otherwise.
    straggler: dict[str, Any] | None = None
    # A job that may restart (--max-restarts): each ended attempt, oldest first (jobs/
    # lifecycle.py `ended_attempt`): attempt, started, ended, outcome, reason, failed_rank,
    # restarted.
    attempts: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    # `--track mlflow` (jobs/tracking/mlflow_run.py): kind, uri, run_id, experiment_id, url,
    # state, message; None for a job not tracked.
    tracking: dict[str, Any] | None = None
    ranks: list[RankRecord] = dataclasses.field(default_factory=list)
    # Internal bookkeeping, never shown over REST.
    supervisor: dict[str, Any] | None = None
    heartbeat: float | None = None
    allocation: dict[str, Any] | None = None
    capacity: dict[str, Any] | None = None
    backend_state: dict[str, Any] = dataclasses.field(default_factory=dict)
    updated: float = 0.0

    @property
    def backend(self) -> str:
        return self.spec.backend

    @property
    def final(self) -> bool:
        return self.state.final

    def to_json(self) -> dict[str, Any]:
        spec = self.spec
        return {
            "id": self.id,
            "name": self.name,
            "state": str(self.state),
            "backend": spec.backend,
            "workers": spec.workers,
            "gpus_per_worker": spec.gpus_per_worker,
            "cpus": spec.cpus,
            "memory": spec.memory,
            "framework": spec.framework,
            "image": spec.image,
            "queue": spec.queue,
            "priority": spec.priority,
            "timeout": spec.timeout,
            "max_restarts": spec.max_restarts,
            "env": dict(spec.env),
            "tensorboard": spec.tensorboard,
            "sync_packages": spec.sync_packages,
            "created": iso(self.created),
            "started": iso(self.started),
            "finished": iso(self.finished),
            "error": self.error,
            "failed_rank": self.failed_rank,
            "reason": self.reason,
            "restarts": self.restarts,
            "queue_position": self.queue_position,
            "owner": self.owner,
            "origin": dict(self.origin),
            "has_result": self.has_result,
            # The job or sweep this one is listed under (a session's cell: the session's
            # job; a sweep's trial: the sweep); null at the top level (jobs/grouping.py).
            "parent": parent_of(self.origin),
            # A sweep's trial: {"id": sweep id, "trial": index, "parallel": K, "name"}; else null.
            "sweep": self.origin.get("sweep"),
            # A session's gang (its ranks) or one of its cells: {"name", "id" (the gang's job),
            # "cell"}; null for other jobs (jobs/sessions.py).
            "session": (
                {
                    "name": self.origin["session"],
                    "id": self.origin.get("session_job") or self.id,
                    "cell": bool(self.origin.get("session_job")),
                }
                if self.origin.get("session")
                else None
            ),
            "gpu_idle_since": iso(self.gpu_idle_since) if self.state is JobState.RUNNING else None,
            "stall_after": spec.stall_after,
            "on_stall": spec.on_stall,
            "stall": (
                {
                    "ranks": list(self.stall.get("ranks", [])),
                    "since": iso(self.stall.get("since")),
                    "where": list(self.stall.get("where", [])),
                }
                if self.stall and self.state is JobState.RUNNING
                else None
            ),
            "straggler": (
                {
                    "ranks": list(self.straggler.get("ranks", [])),
                    "since": iso(self.straggler.get("since")),
                    "rates": {str(k): v for k, v in (self.straggler.get("rates") or {}).items()},
                    "median": self.straggler.get("median"),
                }
                if self.straggler and self.state is JobState.RUNNING
                else None
            ),
            "attempts": [
                {**a, "started": iso(a.get("started")), "ended": iso(a.get("ended"))}
                for a in self.attempts
            ],
            "tracking": (
                {k: self.tracking.get(k) for k in TRACKING_FIELDS} if self.tracking else None
            ),
            "ranks": [r.to_json() for r in self.ranks],
        }
