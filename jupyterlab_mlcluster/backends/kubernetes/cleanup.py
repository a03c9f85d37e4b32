"""A finished job's Kubernetes objects must go, whatever fails meanwhile.

Before its supervisor deletes a job's objects it records a pending cleanup with the job
(`backend_state["pending_cleanup"]`), and clears it once they are gone. A supervisor that
dies before that leaves the record; the reaper (`KubernetesBackend.cleanup_orphans`, also
for jobs already final) tries again, one bounded attempt at a time, spaced by the one backoff
policy, until the objects are gone. An unreachable API server delays the cleanup; it never
cancels it.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from ... import kubeconn
from .client import Resources, connect, kind_of
from .objects import job_selector, object_name
from .plan import JobPlan

log = logging.getLogger("jupyterlab_mlcluster.kubernetes")

PENDING = "pending_cleanup"
FAILURES = kubeconn.FailureLog(log)


def set_pending_cleanup(store: Any, job_id: str, pending: bool, **fields: Any) -> None:
    """Record (with `fields`: attempts, next_attempt) or clear the job's pending cleanup."""
    state = dict(store.get_job(job_id).backend_state or {})
    if pending:
        state[PENDING] = {"since": time.time(), **(state.get(PENDING) or {}), **fields}
    elif PENDING not in state:
        return
    else:
        del state[PENDING]
    store.update_job(job_id, backend_state=state)


def pending_cleanup(job: Any) -> dict[str, Any] | None:
    return (job.backend_state or {}).get(PENDING)


def try_cleanup(store: Any, job: Any, request_timeout: float) -> bool:
    """One bounded attempt to delete the job's objects (when it is due); whether they are
    gone. A failure schedules the next attempt (the one backoff policy)."""
    pending = pending_cleanup(job) or {}
    if pending.get("next_attempt", 0) > time.time():
        return False
    plan = JobPlan.from_dict(job.backend_state)
    kind = kind_of(plan.api_version, plan.kind)
    name = object_name(job.id, job.spec.name)
    try:
        conn = connect(namespace=plan.namespace, request_timeout=request_timeout, probe=False)
        try:
            res = Resources(conn)
            if res.get(kind, name) is not None:
                res.delete(kind, name)
            gone = res.get(kind, name) is None and not res.list(
                kind_of("v1", "Pod"), label_selector=job_selector(job.id)
            )
        finally:
            conn.close()
    except Exception as exc:  # noqa: BLE001 - unreachable, refused, not configured: later
        FAILURES.failed(f"deleting the Kubernetes objects of job {job.id}", exc)
        gone = False
    if gone:
        set_pending_cleanup(store, job.id, False)
        return True
    attempts = int(pending.get("attempts", 0)) + 1
    delay = kubeconn.backoff_from_env().delay(attempts)
    set_pending_cleanup(store, job.id, True, attempts=attempts, next_attempt=time.time() + delay)
    return False
