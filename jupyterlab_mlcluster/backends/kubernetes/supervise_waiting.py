"""Why a Kubernetes attempt waits, inside its supervisor (supervise.py's `_Attempt`): held
by Kueue (suspended: where it stands in its queues, and whether it was preempted), or its
Volcano gang not yet scheduled (its PodGroup's word), each re-read with kueue.py's backoff."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...jobs.model import JobState
from .kueue import KueueView, Standing, standing_text
from .volcano import PodGroupView

if TYPE_CHECKING:
    from .client import Connection
    from .plan import JobPlan
    from .status import Observation


class WaitingReason:
    """The reason of an attempt's job named `name` while it waits. `held_reason`: what the
    job object says while it is suspended; `queued_reason`: what its pods say while a
    Volcano gang waits (None when it does not)."""

    def __init__(self, conn: Connection, plan: JobPlan, name: str):
        self.plan = plan
        # Kueue: where the job stands while it is held (kueue.py), and whether Kueue had
        # admitted it before (then a suspension is a preemption).
        self.kueue = (
            KueueView(conn, plan.namespace, plan.queue)
            if plan.gang == "kueue" and plan.queue
            else None
        )
        self.kueue_standing: Standing | None = None
        # Volcano: while the gang waits, its PodGroup's phase and Unschedulable condition.
        self.volcano = (
            PodGroupView(conn, plan.namespace, name, plan.queue) if plan.gang == "volcano" else None
        )
        self.volcano_text: str | None = None
        self.queued_reason: str | None = None  # observe()'s reason while waiting for pods
        self.held_reason: str | None = None  # observe()'s reason while suspended
        self.admitted_once = False

    def held(self, reason: str | None) -> None:
        """The job is suspended (`reason`: the job object's word)."""
        self.held_reason = reason

    def admitted(self, obs: Observation, job_exists: bool) -> bool:
        """The job is not suspended (any longer); whether it waits for its Volcano gang."""
        if self.held_reason is not None:
            self.kueue_standing = None  # admitted: a later hold is looked at afresh
            if self.kueue is not None:
                self.kueue.next_look = 0.0
        self.held_reason = None
        self.admitted_once = self.admitted_once or job_exists
        waiting = self.volcano is not None and obs.state == JobState.QUEUED
        self.queued_reason = obs.reason if waiting else None
        return waiting

    def queued_text(self, job_exists: bool) -> str | None:
        """A waiting Volcano-gang job's reason: its PodGroup's word first (what `mlcluster
        jobs` has room for), then what its pods say. Re-read with kueue's backoff."""
        if self.volcano is not None and job_exists:
            text = self.volcano.look()
            if text is not False:
                self.volcano_text = text
        if self.volcano_text:
            return f"{self.volcano_text} ({self.queued_reason})"
        return self.queued_reason

    def held_text(self, uid: str | None) -> str | None:
        """The reason of a suspended job (its object's `uid`): where it stands in Kueue when
        Kueue says, and whether it was preempted (suspended again after Kueue had admitted
        it)."""
        if self.kueue is not None and uid:
            standing = self.kueue.look(uid)
            if standing is not None:
                self.kueue_standing = standing
        if self.kueue_standing is not None:
            return standing_text(self.kueue_standing, preempted=self.admitted_once)
        if self.admitted_once and self.plan.gang == "kueue":
            return f"preempted by Kueue (suspended again): {self.held_reason}"
        return self.held_reason
