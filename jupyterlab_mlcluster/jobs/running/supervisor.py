"""The per-job supervisor process.

Run as `python -m jupyterlab_mlcluster.jobs.running.supervisor ROOT JOB`.

It claims the job, keeps a heartbeat, turns cancel requests (a store flag or SIGTERM) and
the death of an attached submitter into `ctx.cancelled`, and runs the job's backend. It is
the only writer of its job's state, and it always leaves the job in a final state.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import psutil

from ...config import MLClusterConfig, get_config
from ...runtime.atomic import drop_leftovers
from ..backend import get_backend
from ..backoff import Backoff
from ..experiments.sweep import wait_for_slot
from ..forensics.straggler import StragglerWatch
from ..lifecycle import format_duration
from ..model import JobState, RankState
from ..record import JobRecord
from ..storage.fsinfo import is_storage_full, no_space_text
from ..storage.series import SeriesWriter
from ..storage.store import Change, JobStore
from ..storage.watch import ENDED
from ..tensorboard_tail import POLL_INTERVAL as TB_POLL_INTERVAL
from ..tensorboard_tail import TensorBoardTail, job_tensorboard_dir
from ..tracking.mlflow_run import MLflowTracker, tracking_uri
from .gpu_idle import IdleGpuWatch
from .lifelines import StoreGone, StoreWatch, attached_process, still_running
from .logwriter import LogWriter
from .processes import HEARTBEAT_INTERVAL, holder_alive, this_host

if TYPE_CHECKING:
    from .fleet import FleetMember

log = logging.getLogger("jupyterlab_mlcluster.supervisor")

CANCEL_POLL_INTERVAL = 0.1
STRAGGLER_CHECK_INTERVAL = 1.0
# A supervisor whose store's disk is full retries writing its job's final state until space
# allows (it never exits leaving the job running): 0.1 s doubling to a 2 s cap, soon enough
# to notice freed space. Equal jitter (floor 0.5): a retry is never immediate, so the many
# writes of a full disk's supervisors neither spin nor come back in step.
FULL_DISK_RETRY = Backoff(first=0.1, cap=2.0, floor=0.5)


SUPERVISOR_LOG_BYTES = 1 << 20


class JobContext:
    """What a backend's run() gets: the job, and ways to report on it."""

    def __init__(
        self,
        store: JobStore,
        job: JobRecord,
        config: MLClusterConfig,
        store_watch: StoreWatch | None = None,
        member: FleetMember | None = None,
    ) -> None:
        self.store = store
        # In a fleet (fleet.py): the fleet beats, and says when to look for a cancel.
        self.member = member
        self.job = job
        self.config = config
        self.logs = LogWriter(
            store, job.id, job.spec.workers, max(0, config.max_log_mib) * (1 << 20)
        )
        self._signalled: str | None = None
        self._cancel: str | None = None
        self._last_cancel_poll = 0.0
        self._last_heartbeat = 0.0
        self._attached = attached_process(job.origin)
        # One per supervisor: a session's cells share their holder's (the store is the same).
        self.store_watch = store_watch or StoreWatch(store, job.id)
        self.idle_gpus = IdleGpuWatch(config.idle_gpu_percent, config.idle_gpu_after)
        self.stragglers = StragglerWatch(getattr(config, "straggler_after", 0.0))
        self.series = SeriesWriter(store.job_dir(job.id), self.logs.system, config.max_series_mib)
        self.tensorboard = TensorBoardTail(
            job_tensorboard_dir(job.spec, store.tensorboard_dir(job.id))
        )
        self._last_tensorboard = 0.0
        self._last_straggler_check = 0.0

    # -- cancellation -----------------------------------------------------------------

    def on_signal(self, signum: int, _frame: Any) -> None:
        self._signalled = f"cancelled (supervisor got {signal.Signals(signum).name})"

    def cancelled(self) -> str | None:
        """Why the job must stop now (a reason string), or None."""
        if self._cancel:
            return self._cancel
        now = time.monotonic()
        due = (
            self.member.due(now - self._last_cancel_poll)
            if self.member is not None
            else now - self._last_cancel_poll >= CANCEL_POLL_INTERVAL
        )
        if self._signalled or due:
            self._last_cancel_poll = now
            gone = self.store_watch.gone()  # (its reads still work: the files are open)
            requested = False if gone else self.store.cancel_requested(self.job.id)
            if gone:
                self._cancel = f"stopped: {gone}"
            elif requested:
                # Who asked, where the asker said (store.request_cancel's reason).
                said = self.store.get_job(self.job.id).reason or ""
                self._cancel = said if said.startswith("cancelled") else "cancelled by user"
            elif requested is None:
                self._cancel = "job was deleted"
            elif self._attached is not None and not still_running(self._attached):
                self._cancel = (
                    f"cancelled: the submitting process (pid {self._attached.pid}) exited"
                )
            elif self._signalled:
                self._cancel = self._signalled
        return self._cancel

    def signalled(self) -> str | None:
        """The signal the supervisor got (SIGTERM, ...), as a cancel reason; None if none."""
        return self._signalled

    def heartbeat(self, force: bool = False) -> None:
        if self.member is not None:
            return  # the fleet beats for all of its jobs at once
        now = time.monotonic()
        if force or now - self._last_heartbeat >= HEARTBEAT_INTERVAL:
            self._last_heartbeat = now
            self.store.update_job(self.job.id, event=Change.HEARTBEAT, heartbeat=time.time())

    def idle_wait(self, active: bool) -> float:
        """How long a backend's loop may wait for news when nothing happens (`active`: its
        ranks run, or something it polls is waited for): a fleet wakes its jobs' loops
        itself (cancel, the store gone), so they need not look often."""
        if self.member is None:
            return CANCEL_POLL_INTERVAL
        return self.member.wait_length(active)

    def on_wake(self, wake: Callable[[], None]) -> None:
        """`wake()` when the job has news its loop must look at (a fleet's cancel); the
        loop running now (a restart's attempt replaces the one before)."""
        if self.member is not None:
            self.member.wake = wake

    def tick(self) -> None:
        """Housekeeping a backend's loop calls every turn (≤ 100 ms apart)."""
        self.heartbeat()
        self.logs.maybe_notify()
        self.check_stragglers()
        self.read_tensorboard()

    def read_tensorboard(self, force: bool = False) -> None:
        """Scalars the ranks wrote with SummaryWriter since the last look, into the series."""
        now = time.monotonic()
        if force or now - self._last_tensorboard >= TB_POLL_INTERVAL:
            self._last_tensorboard = now
            for rank, points in self.tensorboard.poll().items():
                self.series.add(rank, points, source="TensorBoard")

    # -- state --------------------------------------------------------------------------

    def set_state(self, state: JobState, **fields: Any) -> bool:
        moved = self.store.transition(self.job.id, state, **fields)
        if moved:
            self.job.state = state
        return moved

    def set_reason(self, reason: str | None) -> None:
        if reason != self.job.reason:
            self.job.reason = reason
            self.store.update_job(self.job.id, reason=reason)

    def set_ranks(self, changes: dict[int, dict[str, Any]]) -> None:
        self.store.update_ranks(self.job.id, changes)
        if self.stragglers.enabled:
            self._observe_progress(changes)

    def _observe_progress(self, changes: dict[int, dict[str, Any]]) -> None:
        """Each progress report stored, to the straggler watch (every backend's go here)."""
        for rank, fields in changes.items():
            state = fields.get("state")
            if state is not None and (RankState(state).final or state == RankState.PENDING):
                self.stragglers.forget(rank)
                continue
            step = (fields.get("progress") or {}).get("step")
            if step is not None:
                self.stragglers.step(rank, float(step))

    def check_stragglers(self, force: bool = False) -> None:
        """Name the ranks straggling now in the job's record (and its log), or clear them."""
        now = time.monotonic()
        if not self.stragglers.enabled or (
            not force and now - self._last_straggler_check < STRAGGLER_CHECK_INTERVAL
        ):
            return
        self._last_straggler_check = now
        changed = self.stragglers.check(now)
        if changed is None:
            return
        slow, median = changed
        if not slow:
            self.job.straggler = None
            self.store.update_job(self.job.id, straggler=None)
            self.logs.system("[mlcluster] no rank straggles any more")
            return
        ranks = sorted(slow)
        self.job.straggler = {
            "ranks": ranks,
            "since": time.time(),
            "rates": {str(r): round(slow[r], 3) for r in ranks},
            "median": round(median, 3),
        }
        self.store.update_job(self.job.id, straggler=self.job.straggler)
        which = f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}"
        rates = ", ".join(f"{slow[r]:.3g}" for r in ranks)
        self.logs.system(
            f"[mlcluster] {which} straggling: {rates} steps/s against a median of"
            f" {median:.3g} over the last {format_duration(self.stragglers.after)}"
        )

    def set_all_ranks(self, **fields: Any) -> None:
        self.set_ranks({r: dict(fields) for r in range(self.job.spec.workers)})

    def record_metrics(self, samples: dict[int, dict[str, Any]]) -> None:
        """Ranks' latest CPU/memory/GPU figures, and the job's idle-GPU flag they imply."""
        now = time.time()
        self.store.record_metrics(self.job.id, samples, ts=now)
        idle_since = self.idle_gpus.observe(samples, now)
        if idle_since != self.job.gpu_idle_since:
            self.job.gpu_idle_since = idle_since
            self.store.update_job(self.job.id, gpu_idle_since=idle_since)

    def refresh(self) -> JobRecord:
        self.job = self.store.get_job(self.job.id)
        return self.job


def identity() -> dict[str, Any]:
    """This process, as a job's claim names its supervisor."""
    me = psutil.Process()
    return {"pid": me.pid, "create_time": me.create_time(), "host": this_host()}


def claim(store: JobStore, job_id: str, me: dict[str, Any] | None = None) -> bool:
    """Become the job's one supervisor (atomic); False if another live one has it."""
    return store.claim_supervisor(job_id, me or identity(), holder_alive)


def launch_settings(root: Path, job_id: str) -> dict[str, Any]:
    from ..storage.store import check_job_id

    try:
        return json.loads((root / "jobs" / check_job_id(job_id) / "launch.json").read_text())
    except (OSError, ValueError, KeyError):
        return {}


def submitter_config(root: Path, job_id: str) -> MLClusterConfig:
    """The settings the job was submitted with: every MLClusterConfig trait as the submitter
    resolved it (its config files included), so the files need not be read again."""
    from traitlets.config import Config

    snapshot = launch_settings(root, job_id).get("config")
    if not snapshot:
        return get_config()
    return MLClusterConfig(config=Config({"MLClusterConfig": snapshot}))


def _failure_text(store: JobStore, exc: BaseException) -> tuple[str, bool]:
    """(what the job's error says, whether it was a full disk)."""
    if is_storage_full(exc, store.root):
        path = getattr(exc, "filename", None) if isinstance(exc, OSError) else None
        return f"{no_space_text(path or store.db_path)}; the job's ranks were stopped", True
    return f"internal error in the job supervisor: {exc!r}", False


_T = TypeVar("_T")


def _until_written(
    store: JobStore,
    write: Callable[[], _T],
    what: str,
    gone: Callable[[], str | None],
    signalled: Callable[[], str | None] = lambda: None,
) -> _T:
    """`write()`, retried while the store's disk is full (jittered backoff, capped), so the
    job's last word is written as soon as there is space for it. The store's reserve is
    given up first, which makes room at once. Other errors propagate. StoreGone instead of
    a retry when the store is `gone()` (nobody could read the word), or instead of a wait
    for space once `signalled()` (SIGTERM always ends a supervisor; the reaper settles)."""
    failures = 0
    while True:
        try:
            return write()
        except Exception as exc:
            why = gone()
            if why:
                raise StoreGone(f"{what} was not written ({why}): {exc}") from exc
            if not is_storage_full(exc, store.root):
                raise
            if store.release_reserve():
                log.warning("the disk is full: the store's reserve was released to write %s", what)
                continue
            why = signalled()
            if why:
                raise StoreGone(f"{what} was not written ({why}): {exc}") from exc
            failures += 1
            if failures == 1:  # once, not every retry (the log may be on that disk too)
                log.warning("cannot write %s (%s): retrying until there is space", what, exc)
            time.sleep(FULL_DISK_RETRY.delay(failures - 1))  # the first retry is attempt 0


def _settle(store: JobStore, ctx: JobContext, job_id: str) -> None:
    """Never leave the job running, nor any of its ranks unfinished."""
    job = store.get_job(job_id)
    if not job.final:  # a backend returned without finishing
        ctx.set_state(JobState.FAILED, error="the job supervisor stopped without a result")
    leftover = {
        r.rank: {"state": RankState.CANCELLED, "finished": time.time()}
        for r in store.get_job(job_id).ranks
        if not r.state.final
    }
    ctx.set_ranks(leftover)
    # Wakes a follower (the kernel's monitor) at once instead of at its next poll; without
    # it (a full disk) the poll still sees the end.
    with contextlib.suppress(OSError):
        (store.job_dir(job_id) / ENDED).touch()


def supervise(
    store: JobStore,
    job_id: str,
    config: MLClusterConfig | None = None,
    member: FleetMember | None = None,
) -> int:
    """Claim the job and run it to its end: in a process of its own, or as `member` of a
    fleet (fleet.py: a thread of the fleet's process, which holds the claim and the
    signals)."""
    log.debug("supervisor up for %s", job_id)
    config = config or submitter_config(store.root, job_id)
    watch = StoreWatch(store, job_id)  # the job's and its session cells' (JobContext)
    me = member.identity if member is not None else None
    claimed = member is not None and member.claimed
    if not claimed and not _until_written(
        store, lambda: claim(store, job_id, me), "the job's claim", watch.gone
    ):
        watch.close()
        return 0
    log.debug("claimed")
    job = store.get_job(job_id)
    ctx = JobContext(store, job, config, watch, member)
    if member is None:  # (a fleet's process holds the signals: fleet.py)
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, ctx.on_signal)
    tracker = start_tracking(ctx)
    try:
        if wait_for_slot(ctx):
            get_backend(job.spec.backend, config).run(ctx)
        else:
            ctx.set_state(JobState.CANCELLED, reason=ctx.cancelled())
    except BaseException as exc:  # noqa: BLE001 - a supervisor must always finish its job
        error, full = _failure_text(store, exc)
        if full:
            drop_leftovers(store.job_dir(job_id))  # the stopped ranks' half-written outputs
        text = "".join(traceback.format_exception(exc))
        log.warning("job %s fails: %s", job_id, error)
        with contextlib.suppress(Exception):
            ctx.logs.system(f"mlcluster supervisor error: {error if full else text}")
        _until_written(
            store,
            lambda: ctx.set_state(JobState.FAILED, error=error, reason=error if full else None),
            "the job's failure",
            ctx.store_watch.gone,
            ctx.signalled,
        )
    finally:
        settle = lambda: _settle(store, ctx, job_id)  # noqa: E731
        _until_written(store, settle, "the job's final state", ctx.store_watch.gone, ctx.signalled)
        with contextlib.suppress(Exception):  # (a series' last scalars at worst)
            ctx.read_tensorboard(force=True)  # what the ranks wrote last
            ctx.series.close()
        if tracker is not None:  # the job has its final state: the run records it
            tracker.finish()
        with contextlib.suppress(Exception):  # only a change-feed nudge is lost
            ctx.logs.close()
        watch.close()
    return 0


def start_tracking(ctx: JobContext) -> MLflowTracker | None:
    """The job's MLflow run (`--track mlflow`, else MLClusterConfig.track), started."""
    track = ctx.job.spec.track or getattr(ctx.config, "track", "none")
    if track != "mlflow":
        return None
    tracker = MLflowTracker(ctx, tracking_uri(ctx.config.mlflow_tracking_uri, ctx.store.root))
    tracker.start()
    return tracker


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print(
            "usage: python -m jupyterlab_mlcluster.jobs.running.supervisor STORE_DIR JOB_ID",
            file=sys.stderr,
        )
        return 2
    root = Path(argv[0])
    config = submitter_config(root, argv[1])
    mode = launch_settings(root, argv[1]).get("store_journal_mode") or config.store_journal_mode
    store = JobStore(root, journal_mode=mode)
    _log_to_bounded_file(store, argv[1])
    try:
        return supervise(store, argv[1], config)
    except StoreGone as exc:  # the ranks are stopped; the reaper settles a store still there
        log.warning("the supervisor of %s stops: %s", argv[1], exc)
        return 1


def _log_to_bounded_file(store: JobStore, job_id: str) -> None:
    """Log records go to the job's supervisor.log, rotated at SUPERVISOR_LOG_BYTES (one old
    copy kept): a long outage of whatever the backend talks to must not fill the disk."""
    from logging.handlers import RotatingFileHandler

    try:
        handler = RotatingFileHandler(
            store.job_dir(job_id) / "supervisor.log",
            maxBytes=SUPERVISOR_LOG_BYTES,
            backupCount=1,
        )
    except OSError:
        return  # no job directory (a bad id): supervise() says so
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    debug = bool(os.environ.get("MLCLUSTER_DEBUG"))
    logging.basicConfig(level=logging.DEBUG if debug else logging.WARNING, handlers=[handler])


if __name__ == "__main__":
    # A cold supervisor is a program of its own: like a
    # front end, its entry fills the backend registry (a supervisor forked from the warm pool
    # has it from the zygote's entry). Allowed by name in pyproject.toml's import contracts.
    from ... import backends  # noqa: F401

    sys.exit(main())
