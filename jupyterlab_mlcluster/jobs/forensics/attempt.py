"""What every backend's attempt forensics share (local gang.py, Slurm and Kubernetes
attempts): the job's stall watch set from its spec (off where the backend says so: a
session's holder, whose ranks idle between cells by design), the ranks' CPU figures fed to
it and its rule judged, and a report read before the ranks are stopped kept with the job.
A backend says how its ranks' stacks are read (`read`) and which ranks are alive (`live`)."""

from __future__ import annotations

import contextlib
import time
from typing import TYPE_CHECKING, Any

from .job_stall import JobStall
from .kept import keep
from .stacks import StackReport, where_text
from .stall import STALL_CPU_PERCENT, StallWatch

if TYPE_CHECKING:
    from ..lifecycle import Outcome
    from ..running.supervisor import JobContext


class AttemptForensics:
    def __init__(self, ctx: JobContext, enabled: bool, cpu_percent: float = STALL_CPU_PERCENT):
        spec = ctx.job.spec
        self.enabled = enabled
        after = spec.stall_after if spec.stall_after is not None else ctx.config.stall_after
        self.stall = JobStall(
            ctx,
            StallWatch(after if self.enabled else 0.0, cpu_percent=cpu_percent),
            spec.on_stall == "cancel",
        )
        self.job_dir = ctx.store.job_dir(ctx.job.id)
        self.stopping = False  # the ranks are being stopped: no stall is judged any more

    def read(self, ranks: list[int], why: str) -> StackReport:
        raise NotImplementedError

    def live(self) -> list[int]:
        """The ranks started and not yet ended."""
        raise NotImplementedError

    def watching(self) -> bool:
        """Whether the stall rule is judged now."""
        return self.stall.enabled and not self.stopping

    def active(self, rank: int) -> None:
        if self.stall.enabled:
            self.stall.active(rank)

    def sampled(self, samples: dict[int, dict[str, Any]]) -> Outcome | None:
        """The ranks' CPU figures; the stall rule judged. An outcome: end the job
        (--on-stall cancel)."""
        if not self.watching():
            return None
        now = time.monotonic()
        for rank, sample in samples.items():
            self.stall.cpu(rank, sample.get("cpu_percent"), now)
        return self.stall.judge(self.live(), self.read, now)

    def kept(self, report: StackReport | None, why: str) -> str:
        """`report` (read before the ranks are stopped because of `why`) kept with the job:
        the clause for its reason or error ('' when it holds nothing)."""
        if report is None or not (report.ranks or report.missing):
            return ""
        report.why = why
        with contextlib.suppress(OSError):  # (a full disk: the job's reason still says it)
            keep(self.job_dir, report)
        return where_text(report, still=why == "failed")
