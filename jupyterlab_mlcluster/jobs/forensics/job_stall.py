"""A job's stall, as every backend declares it: the stall rule (`stall.py`) judged over the
attempt's live ranks, and what a change means for the job (its record's `stall`, a line in
its log, the stacks of that moment kept, and with `--on-stall cancel` the outcome that ends
it). Backends feed it what they already see and say how to read their ranks' stacks."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from ..lifecycle import Outcome, OutcomeKind, format_duration
from .kept import keep
from .stacks import StackReport, fold_lines, where_text
from .stall import StallWatch

if TYPE_CHECKING:
    from ..running.supervisor import JobContext


class JobStall:
    def __init__(self, ctx: JobContext, watch: StallWatch, cancel_on_stall: bool):
        self.ctx = ctx
        self.watch = watch
        self.cancel_on_stall = cancel_on_stall
        self.job_dir: Path = ctx.store.job_dir(ctx.job.id)

    @property
    def enabled(self) -> bool:
        return self.watch.enabled

    def active(self, rank: int, now: float | None = None) -> None:
        """The rank printed, reported progress or started."""
        self.watch.active(rank, now)

    def cpu(self, rank: int, percent: float | None, now: float | None = None) -> None:
        self.watch.cpu(rank, percent, now)

    def judge(
        self,
        live: Iterable[int],
        read: Callable[[list[int], str], StackReport],
        now: float | None = None,
    ) -> Outcome | None:
        """Judge the rule now. When the set of stalled ranks changed, say so on the job;
        an outcome when the job must end (--on-stall cancel)."""
        now = time.monotonic() if now is None else now
        live = list(live)
        changed = self.watch.check(live, now)
        if changed is None:
            return None
        if not changed:
            self.clear("[mlcluster] no rank is stalled any more")
            return None
        report = read(live, "stalled")
        with contextlib.suppress(OSError):  # the stall is said even where nothing is kept
            keep(self.job_dir, report)
        ranks = sorted(changed)
        self._record(
            {
                "ranks": ranks,
                "since": time.time() - (now - min(changed.values())),
                "where": fold_lines(report, main_only=True),
            }
        )
        which = f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}"
        what = (
            f"{which} stalled: no output, progress or CPU for {format_duration(self.watch.after)}"
        )
        blind = [r for r in ranks if r not in self.watch.cpu_seen]
        if blind:  # nothing said how busy they were: judged without that, and said so
            what += f" (no CPU figure for rank {', '.join(map(str, blind))})"
        where = where_text(report)
        self.ctx.logs.system(f"[mlcluster] {what}; {where}")
        if not self.cancel_on_stall:
            return None
        return Outcome(OutcomeKind.CANCELLED, f"cancelled (--on-stall cancel): {what}", where=where)

    def clear(self, line: str | None = None) -> None:
        """No rank is stalled (any more, or in a new attempt)."""
        if self.ctx.job.stall is None:
            return
        self._record(None)
        if line:
            self.ctx.logs.system(line)

    def _record(self, stall: dict | None) -> None:
        self.ctx.job.stall = stall
        self.ctx.store.update_job(self.ctx.job.id, stall=stall)
