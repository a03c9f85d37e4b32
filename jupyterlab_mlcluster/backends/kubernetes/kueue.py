"""Where a job held by Kueue stands: its LocalQueue, ClusterQueue, position and why it waits.

Read from Kueue itself, in the job's supervisor, while the job object is suspended:
- the LocalQueue (`kueue.x-k8s.io/v1beta1`) names its ClusterQueue (read once);
- the job's Workload (label `kueue.x-k8s.io/job-uid` = the job object's uid) says why it is
  not admitted (`QuotaReserved` False: its message) or that it was evicted (`Evicted` True,
  e.g. reason `Preempted`);
- Kueue's visibility API (`visibility.kueue.x-k8s.io/v1beta1`, an aggregated API) lists the
  LocalQueue's pending workloads with their positions (0-based).

Each piece is optional: a cluster without the visibility API (or RBAC to read it) still
gives the queue names and the reason. `standing_text` is pure; `KueueView` talks to the API
and backs off (with jitter, capped) when asking fails, so a missing API is not asked every tick.
"""

from __future__ import annotations

import dataclasses
import logging
import random
import time
from typing import Any

from ...jobs.backoff import Backoff

log = logging.getLogger("jupyterlab_mlcluster.kubernetes")

KUEUE = "/apis/kueue.x-k8s.io/v1beta1"
VISIBILITY = "/apis/visibility.kueue.x-k8s.io/v1beta1"
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
POLL_INTERVAL = 2.0  # seconds between looks while the job waits
MAX_BACKOFF = 60.0
# After n failed looks in a row (n from 1) the next waits in [c/2, c], c = 2 s * 2**n up to
# MAX_BACKOFF: equal jitter, so a look never comes sooner than the normal poll.
LOOK_BACKOFF = Backoff(first=POLL_INTERVAL, cap=MAX_BACKOFF, floor=0.5)


@dataclasses.dataclass
class Standing:
    local_queue: str
    cluster_queue: str | None = None
    position: int | None = None  # 0-based, in the LocalQueue
    waiting_because: str | None = None  # the Workload's QuotaReserved/Admitted message
    evicted: str | None = None  # the Workload's Evicted reason: message


def _condition(obj: dict[str, Any], kind: str) -> dict[str, Any] | None:
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind:
            return cond
    return None


def standing_from(
    local_queue: str,
    cluster_queue: str | None,
    workload: dict[str, Any] | None,
    pending: list[dict[str, Any]] | None,
    job_uid: str,
) -> Standing:
    """Pure: the standing from what Kueue answered (any piece may be None)."""
    standing = Standing(local_queue=local_queue, cluster_queue=cluster_queue)
    workload_name = ((workload or {}).get("metadata") or {}).get("name")
    for item in pending or []:
        meta = item.get("metadata") or {}
        owners = {ref.get("uid") for ref in meta.get("ownerReferences") or []}
        if (workload_name and meta.get("name") == workload_name) or job_uid in owners:
            position = item.get("positionInLocalQueue")
            standing.position = position if isinstance(position, int) and position >= 0 else None
            break
    if workload is not None:
        evicted = _condition(workload, "Evicted")
        if evicted is not None and evicted.get("status") == "True":
            standing.evicted = ": ".join(
                p for p in (evicted.get("reason"), evicted.get("message")) if p
            )
        for kind in ("QuotaReserved", "Admitted"):
            cond = _condition(workload, kind)
            if cond is not None and cond.get("status") == "False" and cond.get("message"):
                standing.waiting_because = str(cond["message"])
                break
    return standing


def standing_text(standing: Standing, *, preempted: bool) -> str:
    """The job's reason while Kueue holds it, e.g. 'Kueue position 3 in LocalQueue team-a
    (ClusterQueue gpu-cq); couldn't assign flavors ...' (position 1-based)."""
    where = f"LocalQueue {standing.local_queue}"
    if standing.cluster_queue:
        where += f" (ClusterQueue {standing.cluster_queue})"
    if standing.position is not None:
        where = f"position {standing.position + 1} in {where}"
    else:
        where = f"waiting in {where}"
    if preempted:
        text = "preempted by Kueue (suspended again)"
        if standing.evicted:
            text += f" [{standing.evicted}]"
        text += f", {where}"
    else:
        text = f"Kueue {where}"
    if standing.waiting_because:
        text += f"; {standing.waiting_because}"
    return text


class KueueView:
    """Asks Kueue about one job (in its supervisor); `look` returns None until it is time to
    look again, or when Kueue answered nothing at all."""

    def __init__(
        self, conn: Any, namespace: str, local_queue: str, rng: random.Random | None = None
    ):
        self.conn = conn
        self.namespace = namespace
        self.local_queue = local_queue
        self.cluster_queue: str | None = None
        self.next_look = 0.0
        self.failures = 0
        self.rng = rng or random.Random()

    def _get(self, path: str, query: dict[str, Any] | None = None) -> dict[str, Any] | None:
        try:
            return self.conn.request("GET", path, query=query)
        except Exception as exc:  # noqa: BLE001 - optional knowledge; the caller backs off
            log.debug("Kueue: GET %s failed: %s", path, exc)
            self.failures += 1
            return None

    def look(self, job_uid: str, now: float | None = None) -> Standing | None:
        now = time.monotonic() if now is None else now
        if now < self.next_look:
            return None
        failures_before = self.failures
        ns, lq = self.namespace, self.local_queue
        if self.cluster_queue is None:
            queue = self._get(f"{KUEUE}/namespaces/{ns}/localqueues/{lq}")
            self.cluster_queue = ((queue or {}).get("spec") or {}).get("clusterQueue")
        workloads = self._get(
            f"{KUEUE}/namespaces/{ns}/workloads", {"labelSelector": f"{JOB_UID_LABEL}={job_uid}"}
        )
        workload = ((workloads or {}).get("items") or [None])[0]
        pending = self._get(f"{VISIBILITY}/namespaces/{ns}/localqueues/{lq}/pendingworkloads")
        items = (pending or {}).get("items") if pending is not None else None
        if self.failures > failures_before:
            # Jittered, capped: a cluster without the visibility API is asked rarely (each
            # of a look's refused reads counts as a failure, so it backs off faster).
            self.next_look = now + LOOK_BACKOFF.delay(self.failures, rng=self.rng)
        else:
            self.failures = 0
            self.next_look = now + POLL_INTERVAL
        if self.cluster_queue is None and workload is None and items is None:
            return None  # Kueue told us nothing (not installed here, or not readable)
        return standing_from(lq, self.cluster_queue, workload, items, job_uid)
