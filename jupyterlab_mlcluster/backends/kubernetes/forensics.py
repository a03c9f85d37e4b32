"""A Kubernetes attempt's forensics (jobs/forensics/), inside its supervisor (supervise.py's
`_Attempt`): where each rank's stack helper listens (stacks.py; written for the asking
processes), the stall watch fed by what the log streams carry (output lines, progress, the
ranks' own CPU records, and the metrics API's figure where it is served), the stacks of the
ranks still alive taken before they are stopped (a cancel, the timeout, a failing rank, a
stall with --on-stall cancel) and kept with the job, and a failing rank's peers read while
it waits (runtime/stackdump.py's pause; the helper's ack lets it go).

A session's attempt has none of it: its ranks idle between cells by design.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

from ...jobs import forensics
from ...jobs.model import RankState
from ...jobs.sessions import is_session_holder
from . import stacks
from .objects import pod_ranks

if TYPE_CHECKING:
    from .supervise import _Attempt

# A read here holds up the supervisor's loop (a stop, a failing rank's exit).
SUPERVISOR_READ_TIMEOUT = 5.0
# A pod's rank reports its own CPU, its reporter thread included (and the metrics API's
# figure is the whole container's): asleep it reads 0.5-1 %, which the local rule (1 %)
# would take for activity. A rank at work reads far more.
SELF_REPORTED_CPU_PERCENT = 3.0


class AttemptForensics(forensics.AttemptForensics):
    def __init__(self, attempt: _Attempt) -> None:
        super().__init__(
            attempt.ctx, not is_session_holder(attempt.ctx.job), SELF_REPORTED_CPU_PERCENT
        )
        self.attempt = attempt
        self.ports: dict[int, int] = {}
        self.endpoints: dict[int, dict[str, Any]] = {}
        self.at_failure: forensics.StackReport | None = None
        with contextlib.suppress(OSError):  # an earlier attempt's pods are gone
            stacks.write_endpoints(self.job_dir, attempt.number, {})

    # -- where the helpers listen -----------------------------------------------------

    def port(self, rank: int, value: Any) -> None:
        """A rank's signed record: its helper's port."""
        if isinstance(value, int) and 0 < value < 65536 and 0 <= rank < self.attempt.spec.workers:
            self.ports[rank] = value
            self.pods_changed()

    def pods_changed(self) -> None:
        """Write where each rank's helper listens when that changed (its pod's IP comes
        from the pod's status, never from the rank)."""
        if not self.ports:
            return
        a = self.attempt
        endpoints: dict[int, dict[str, Any]] = {}
        for name, pod in a.my_pods().items():
            ip = (pod.get("status") or {}).get("podIP")
            for rank in pod_ranks(pod, a.plan.engine, a.plan.ranks_per_pod):
                if rank in self.ports:
                    endpoints[rank] = {"pod": name, "ip": ip, "port": self.ports[rank]}
        if endpoints != self.endpoints:
            self.endpoints = endpoints
            with contextlib.suppress(OSError):
                stacks.write_endpoints(self.job_dir, a.number, endpoints)

    # -- what the supervisor sees -----------------------------------------------------

    def on_failing(self, rank: int) -> None:
        """A rank's code raised and it waits: read its live peers, then let it go."""
        try:
            if self.enabled and not self.stopping and self.at_failure is None:
                peers = [r for r in self.live() if r != rank]
                self.at_failure = self.read(peers, "failed") if peers else None
        finally:
            stacks.let_go(self.endpoints.get(rank), self.attempt.run_.key, rank)

    # -- at the end -------------------------------------------------------------------

    def before_stop(self, why: str, exclude: set[int] | None = None) -> str:
        """The live ranks' stacks, kept, before the attempt stops them: the clause for the
        job's reason or error ('' when none were read or it is off)."""
        if not self.enabled or self.stopping:
            return ""
        self.stopping = True
        report = self.at_failure if why == "failed" else None
        if report is None:
            live = [r for r in self.live() if r not in (exclude or set())]
            report = self.read(live, why) if live else None
        return self.kept(report, why)

    def read(self, ranks: list[int], why: str) -> forensics.StackReport:
        return stacks.read_stacks(
            self.attempt.ctx.job.id,
            self.attempt.run_.key,
            self.endpoints,
            ranks,
            {},
            why=why,
            timeout=SUPERVISOR_READ_TIMEOUT,
        )

    def live(self) -> list[int]:
        a = self.attempt
        return [
            r
            for r in sorted(a.started_ranks)
            if not RankState(a.written.get(r, {}).get("state", RankState.RUNNING)).final
        ]
