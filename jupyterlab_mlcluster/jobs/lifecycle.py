"""The life of a job inside its supervisor, the same for every backend.

A backend runs attempts (all ranks started together, watched until an outcome); this
module turns outcomes into the job's final state, restarts the whole gang while
`max_restarts` allows, reads the failing rank's own error report, and batches per-rank
updates so a chatty job does not write the store on every progress tick. Each backend
keeps only what differs: how an attempt starts, is watched and is stopped.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import signal
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, overload

from ..runtime.errors import read_error_file
from .model import JobState

if TYPE_CHECKING:
    from .running.supervisor import JobContext
    from .storage.series import SeriesWriter
    from .storage.store import JobStore

# Written into the ranks' logs before a restart; log readers split attempts on it.
RESTART_MARKER = "restarting all ranks"
RANK_FLUSH_INTERVAL = 0.1


class OutcomeKind(enum.StrEnum):
    """How an attempt ended (its values are the strings the backends used to write)."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    TIMEOUT = "timeout"
    RESTART = "restart"  # a session's attempt only: fresh ranks, the same session


@dataclasses.dataclass
class Outcome:
    """How one attempt ended."""

    kind: OutcomeKind
    message: str | None = None  # the reason (cancel, timeout) or what the backend saw
    failed_rank: int | None = None
    failed_pod: str | None = None
    restartable: bool = True  # False: starting again would fail the same way
    exit_code: int | None = None  # of the failed rank's process, where there is one
    # Where the ranks still alive were when the attempt ended (their folded stacks, taken
    # before they were stopped: jobs/forensics/), added to the job's reason or error.
    where: str | None = None

    def __post_init__(self) -> None:
        self.kind = OutcomeKind(self.kind)  # a kind no backend knows fails here, not later

    def with_reason(self, more: str) -> Outcome:
        """The same outcome, its message followed by `more` (what stopping the ranks did)."""
        return dataclasses.replace(self, message=(self.message or "") + more)


def stop_requested(ctx: JobContext) -> Outcome | None:
    """Must the running attempt stop now? A cancel request (its reason), or the job's
    timeout past since its ranks started; None: go on. Every backend's watch loop asks
    this at each turn (and stops its ranks its own way, saying so in the reason)."""
    reason = ctx.cancelled()
    if reason:
        return Outcome(OutcomeKind.CANCELLED, reason)
    timeout, started = ctx.job.spec.timeout, ctx.job.started
    if timeout and started and time.time() > started + timeout:
        return Outcome(OutcomeKind.TIMEOUT, timed_out(timeout))
    return None


def timed_out(timeout: float | None) -> str:
    """The reason of a job stopped at its timeout."""
    return f"timed out after {format_duration(timeout or 0)}"


def run_attempts(
    ctx: JobContext,
    attempt: Callable[[int], Outcome],
    *,
    before_restart: Callable[[], None] = lambda: None,
) -> None:
    """Run `attempt(n)` until it succeeds, is stopped, or fails past `max_restarts`;
    then put the job in its final state."""
    spec = ctx.job.spec
    number = ctx.job.restarts
    while True:
        reason = ctx.cancelled()
        if reason:
            finish(ctx, Outcome(OutcomeKind.CANCELLED, reason))
            return
        began = time.time()
        outcome = attempt(number)
        if (
            outcome.kind == OutcomeKind.FAILED
            and outcome.restartable
            and number < spec.max_restarts
        ):
            said = failure_text(ctx.store, ctx.job.id, outcome)
            history = ended_attempt(ctx, number, began, outcome, said, restarted=True)
            number += 1
            ctx.logs.system(
                f"[mlcluster] {said}; {RESTART_MARKER} (restart {number} of {spec.max_restarts})"
            )
            ctx.store.update_job(
                ctx.job.id, restarts=number, error=None, failed_rank=None, attempts=history
            )
            ctx.job.restarts = number
            forget_attempt_outputs(ctx)
            before_restart()
            continue
        if spec.max_restarts:  # (a job that cannot restart has one attempt: the job itself)
            why = None if outcome.kind == OutcomeKind.SUCCEEDED else ending_text(ctx, outcome)
            history = ended_attempt(ctx, number, began, outcome, why, restarted=False)
            ctx.store.update_job(ctx.job.id, attempts=history)
        finish(ctx, outcome)
        return


# Attempts kept in a job's record; a job restarted more often keeps its first and its last.
ATTEMPTS_KEPT = 50


def ended_attempt(
    ctx: JobContext,
    number: int,
    began: float,
    outcome: Outcome,
    said: str | None,
    *,
    restarted: bool,
) -> list[dict[str, Any]]:
    """The job's attempts with this one added: its number (TORCHELASTIC_RESTART_COUNT),
    when it ran, how it ended and why, and whether the gang was started again after it."""
    entry = {
        "attempt": number,
        "started": began,
        "ended": time.time(),
        "outcome": str(outcome.kind),
        "reason": said,
        "failed_rank": outcome.failed_rank,
        "restarted": restarted,
    }
    history = [*(ctx.job.attempts or []), entry]
    if len(history) > ATTEMPTS_KEPT:
        history = history[:1] + history[-(ATTEMPTS_KEPT - 1) :]
    ctx.job.attempts = history
    return history


def ending_text(ctx: JobContext, outcome: Outcome) -> str:
    """What the job's error or reason says of how its last attempt ended (`finish`'s)."""
    where = f"; {outcome.where}" if outcome.where else ""
    if outcome.kind == OutcomeKind.FAILED:
        return failure_text(ctx.store, ctx.job.id, outcome) + where
    return (outcome.message or "") + where if outcome.message else outcome.where or ""


def forget_attempt_outputs(ctx: JobContext) -> None:
    """A new attempt must not report the previous one's result or tracebacks."""
    store, job_id = ctx.store, ctx.job.id
    store.result_path(job_id).unlink(missing_ok=True)
    store.result_json_path(job_id).unlink(missing_ok=True)
    for rank in range(ctx.job.spec.workers):
        store.error_path(job_id, rank).unlink(missing_ok=True)


def finish(ctx: JobContext, outcome: Outcome) -> None:
    """The job's final state from the last attempt's outcome."""
    job_id = ctx.job.id
    ctx.read_tensorboard(force=True)  # the scalars written last are the job's before it ends
    where = f"; {outcome.where}" if outcome.where else ""
    said = outcome.message + where if outcome.message else outcome.where or outcome.message
    if outcome.kind == OutcomeKind.SUCCEEDED:
        has_result = ctx.store.result_path(job_id).exists()
        ctx.set_state(JobState.SUCCEEDED, has_result=has_result, reason=None)
    elif outcome.kind == OutcomeKind.CANCELLED:
        ctx.set_state(JobState.CANCELLED, reason=said)
    elif outcome.kind == OutcomeKind.TIMEOUT:
        ctx.set_state(JobState.FAILED, error=said, reason=said)
    else:
        ctx.set_state(
            JobState.FAILED,
            error=failure_text(ctx.store, job_id, outcome) + where,
            failed_rank=outcome.failed_rank,
            reason=None,
        )


def read_error_report(store: JobStore, job_id: str, rank: int) -> dict[str, Any] | None:
    """The rank's own account of its exception (ours, or a torchelastic `@record` one)."""
    return read_error_file(store.error_path(job_id, rank), rank)


@overload
def reported_failure(rank: int, report: dict[str, Any]) -> str: ...
@overload
def reported_failure(rank: int, report: dict[str, Any] | None) -> str | None: ...
def reported_failure(rank: int, report: dict[str, Any] | None) -> str | None:
    """'rank N failed: <type>: <message>' of an error report, the way failure_text says it."""
    if not isinstance(report, dict):
        return None
    return f"rank {rank} failed: {report.get('exc_type')}: {report.get('message')}".rstrip(": ")


def failure_text(store: JobStore, job_id: str, outcome: Outcome) -> str:
    """The failing rank's exception when it reported one, else how its process ended,
    else what the backend saw."""
    rank, code = outcome.failed_rank, outcome.exit_code
    report = read_error_report(store, job_id, rank) if rank is not None else None
    if rank is not None and report:  # (a report is only read for a rank)
        return reported_failure(rank, report)
    if outcome.message:
        return outcome.message
    if rank is None:
        return "the job failed"
    if code is not None and code < 0:
        name = (
            signal.Signals(-code).name if -code in signal.Signals._value2member_map_ else str(-code)
        )
        hint = " (out of memory?)" if -code == signal.SIGKILL else ""
        return f"rank {rank} was killed by {name}{hint}"
    return f"rank {rank} exited with status {code}"


class RankUpdates:
    """Per-rank changes gathered and written together: a rank's state goes out at the
    next flush, progress at most every RANK_FLUSH_INTERVAL."""

    def __init__(
        self,
        ctx: JobContext,
        *,
        states_at_once: bool = True,
        series: Callable[[], SeriesWriter] | None = None,
    ):
        self.ctx = ctx
        self.states_at_once = states_at_once
        # Where `mlc.log`'s points go now: the job's series (a session's: its running cell's).
        self.series = series or (lambda: ctx.series)
        self.pending: dict[int, dict[str, Any]] = {}
        self.last_flush = 0.0
        # Each rank's last numbered series batch kept (across a session's cells).
        self.batches: dict[int, tuple[str, int]] = {}

    def update(self, rank: int, **fields: Any) -> None:
        progress = fields.get("progress")
        if isinstance(progress, dict) and "series" in progress:
            # `mlc.log` rides on the progress report: its points are the job's series
            # (kept at once, in order), and a report with no step of its own moves no bar.
            points, batch = progress.pop("series"), _batch_number(progress.pop("batch", None))
            if batch is None or self._first_time(rank, batch):
                self.series().add(rank, points, batch=batch)
            if progress.get("step") is None:
                del fields["progress"]
                if not fields:
                    return
        self.pending.setdefault(rank, {}).update(fields)

    def _first_time(self, rank: int, batch: tuple[str, int]) -> bool:
        """Whether `rank`'s numbered batch is new. The rank's output read again (a pod log
        re-opened, a job adopted) brings its batches again; a batch of a new process
        (another origin: a restarted rank) is new."""
        last = self.batches.get(rank) or self.series().last_batch(rank)
        if last is not None and last[0] == batch[0] and batch[1] <= last[1]:
            return False
        self.batches[rank] = batch
        return True

    def get(self, rank: int, key: str) -> Any:
        return self.pending.get(rank, {}).get(key)

    def flush(self, force: bool = False) -> None:
        now = time.monotonic()
        urgent = force or (self.states_at_once and any("state" in f for f in self.pending.values()))
        if self.pending and (urgent or now - self.last_flush >= RANK_FLUSH_INTERVAL):
            self.ctx.set_ranks(self.pending)
            self.pending = {}
            self.last_flush = now


def _batch_number(batch: Any) -> tuple[str, int] | None:
    """A series record's number, (origin, n) (runtime/scalars.py); None if it has none or
    one that is no number (a rank's record is user code's: an infinity, say)."""
    try:
        origin, number = batch
        return str(origin)[:32], int(number)
    except (TypeError, ValueError, OverflowError):
        return None


PROGRESS_DESC_MAX = 200  # characters of a progress report's description kept


def clean_progress(value: dict[str, Any]) -> dict[str, Any]:
    """Only the fields a progress report may carry, as what each is (it comes from user
    code): step and total numbers (else None), the description text, cut short."""

    def number(v: Any) -> float | int | None:
        ok = isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
        return v if ok else None

    desc = value.get("desc")
    clean = {
        "step": number(value.get("step")),
        "total": number(value.get("total")),
        "desc": None if desc is None else str(desc)[:PROGRESS_DESC_MAX],
    }
    if "series" in value:  # `mlc.log`'s points: RankUpdates hands them to the series store
        clean["series"] = value["series"]
        clean["batch"] = value.get("batch")
    return clean


def format_duration(seconds: float | None) -> str:
    if seconds is None:
        return ""
    seconds = float(seconds)
    if seconds < 120:
        return f"{seconds:g}s"
    if seconds < 7200:
        return f"{seconds / 60:g}m"
    return f"{seconds / 3600:g}h"
