"""Where a job gang-scheduled by Volcano stands while it waits: its PodGroup's phase and
conditions.

Volcano keeps a job's pods unbound until the whole gang (the PodGroup's `minMember`) fits.
While they wait, the PodGroup (`scheduling.volcano.sh/v1beta1`, named like the job) says why:
`status.phase` Pending (not yet let into its queue), Inqueue (let in, not yet placed) or
Running, and a condition of type `Unschedulable` whose reason/message is the scheduler's
(e.g. `0/3 nodes are available: 3 Insufficient nvidia.com/gpu`). A PodGroup that ran and
waits again was evicted or preempted; Volcano says so in the condition's reason.

`podgroup_text` is pure; `PodGroupView` reads the PodGroup in the job's supervisor and backs
off (with jitter, capped) when asking fails, as kueue.KueueView does.
"""

from __future__ import annotations

import logging
import random
import time
from typing import Any, Literal

# Looked at, and backed off from, exactly as Kueue's view of a waiting job.
from .kueue import LOOK_BACKOFF, POLL_INTERVAL

log = logging.getLogger("jupyterlab_mlcluster.kubernetes")

API = "/apis/scheduling.volcano.sh/v1beta1"
_EVICTED_WORDS = ("evict", "preempt", "reclaim")


def podgroup_text(podgroup: dict[str, Any], queue: str | None, *, ran_before: bool) -> str | None:
    """Pure: the job's reason from its PodGroup, e.g. 'Volcano: PodGroup pending in queue
    training: 0/3 nodes are available: 3 Insufficient nvidia.com/gpu'. None once it runs and
    nothing is unschedulable (the pods' own states say the rest)."""
    status = podgroup.get("status") or {}
    phase = str(status.get("phase") or "Pending")
    queue = queue or (podgroup.get("spec") or {}).get("queue") or "default"
    unschedulable = None
    for cond in status.get("conditions") or []:
        unschedulable_now = (
            cond.get("status", "True") == "True" if isinstance(cond, dict) else False
        )
        if unschedulable_now and cond.get("type") == "Unschedulable":
            unschedulable = cond
    if phase == "Running" and unschedulable is None:
        return None
    reason = str((unschedulable or {}).get("reason") or "")
    message = str((unschedulable or {}).get("message") or "")
    evicted = any(word in reason.lower() for word in _EVICTED_WORDS)
    if evicted or (ran_before and phase != "Running"):
        text = f"Volcano: PodGroup preempted/evicted, waiting again in queue {queue}"
        if reason:
            text += f" [{reason}]"
    else:
        text = f"Volcano: PodGroup {phase.lower()} in queue {queue}"
    if message:
        text += f": {message[:300]}"
    return text


class PodGroupView:
    """Reads one job's PodGroup (in its supervisor); `look` returns None until it is time to
    look again, or when the PodGroup could not be read."""

    def __init__(
        self,
        conn: Any,
        namespace: str,
        name: str,
        queue: str | None,
        rng: random.Random | None = None,
    ):
        self.conn = conn
        self.path = f"{API}/namespaces/{namespace}/podgroups/{name}"
        self.queue = queue
        self.next_look = 0.0
        self.failures = 0
        self.ran_before = False
        self.rng = rng or random.Random()

    def look(self, now: float | None = None) -> str | None | Literal[False]:
        """The reason text; None when it says nothing to add; False when not time to look or
        the read failed (keep what was shown)."""
        now = time.monotonic() if now is None else now
        if now < self.next_look:
            return False
        try:
            podgroup = self.conn.request("GET", self.path)
        except Exception as exc:  # noqa: BLE001 - optional knowledge; back off and go on
            log.debug("Volcano: GET %s failed: %s", self.path, exc)
            self.failures += 1
            self.next_look = now + LOOK_BACKOFF.delay(self.failures, rng=self.rng)
            return False
        self.failures = 0
        self.next_look = now + POLL_INTERVAL
        if not isinstance(podgroup, dict):
            return False
        text = podgroup_text(podgroup, self.queue, ran_before=self.ran_before)
        if ((podgroup.get("status") or {}).get("phase")) == "Running":
            self.ran_before = True
        return text
