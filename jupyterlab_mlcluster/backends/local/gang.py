"""One attempt of a local job: its gang of ranks started together (warm from the pool or
cold), their output pumped into the job's logs, their exits and reports watched until an
outcome (success, the first failing rank, a cancel or the timeout), and every rank stopped
as torchrun stops them. The local backend (backend.py) runs one per attempt; a session's
supervisor side (session.py) serves cells on one that lives across them.
"""

from __future__ import annotations

import contextlib
import logging
import os
import selectors
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from ...jobs import lifecycle
from ...jobs.lifecycle import Outcome, OutcomeKind
from ...jobs.model import JobSpec, JobState, RankState
from ...jobs.running.proctree import Containment
from ...jobs.storage.store import JobStore
from ...runtime.protocol import OutputParser, job_key, key_path
from ...runtime.samplers import RankSampler
from ...runtime.submitter_env import base_environment
from . import launcher
from .forensics import GangForensics

if TYPE_CHECKING:
    from ...jobs.running.supervisor import JobContext
    from ...jobs.storage.series import SeriesWriter

log = logging.getLogger("jupyterlab_mlcluster.supervisor")

LOOP_TICK = 0.05
DRAIN_TIMEOUT = 2.0
REAP_INTERVAL = 1.0
# Reading an exited rank's pipes to the end before it counts as finished stops after this
# many bytes (something it started may keep writing to them).
RANK_DRAIN_CAP = 64 << 20
EXIT_STREAM = "x"  # a rank's pidfd in the selector, beside its "o", "e" and "c" pipes


class Gang:
    """One attempt: start every rank, pump their output, watch them, stop them."""

    def __init__(
        self,
        ctx: JobContext,
        spec: JobSpec,
        allocation: dict[str, Any],
        launch: dict[str, Any],
        attempt: int,
        sampler: RankSampler,
        tree: Containment,
    ) -> None:
        self.ctx = ctx
        self.tree = tree
        self.last_reap = 0.0
        self.spec = spec
        self.allocation = allocation
        self.launch = launch
        self.attempt = attempt
        self.sampler = sampler
        self.ranks: list[launcher.RankProcess] = []
        self.selector = selectors.DefaultSelector()
        self.parsers: dict[tuple[int, str], OutputParser] = {}
        # Ranks' states wait for the next flush with their progress (a rank's
        # start is seen within RANK_FLUSH_INTERVAL anyway; its exit forces a flush).
        self.rank_updates = lifecycle.RankUpdates(ctx, states_at_once=False, series=self.series_now)
        self.last_metrics = 0.0
        self.open_fds = 0
        self.done: set[int] = set()  # ranks whose exit we have seen
        self.failed_seen: dict[int, float] = {}  # failed ranks -> when their exit was seen
        # A rank's error report sent over its report channel: only when its error file
        # could not be written (a full disk); the file, where there is one, wins.
        self.reported_errors: dict[int, dict[str, Any]] = {}
        # Stalls, and the stacks of ranks still alive when the attempt ends (forensics.py).
        self.forensics = GangForensics(self)
        self.stall_outcome: Outcome | None = None

    # -- start ------------------------------------------------------------------------

    def series_now(self) -> SeriesWriter:
        """Where the ranks' logged points go now (a session's: its running cell's)."""
        return self.ctx.series

    def start(self) -> None:
        ctx, spec, job_id = self.ctx, self.spec, self.ctx.job.id
        base = base_environment(self.launch.get("env", {}))
        ports = launcher.job_ports(spec)
        store: JobStore = ctx.store
        payload_path = str(store.payload_path(job_id))
        key = job_key(key_path(payload_path))  # beside the payload: each rank reads it there
        tensorboard_dir = store.tensorboard_dir(job_id)
        tensorboard_dir.mkdir(mode=0o700, exist_ok=True)
        warm = _running_warm()
        cold_because: list[str] = []
        # A machine without GPUs leaves CUDA_VISIBLE_DEVICES as the user had it (torchrun).
        pool_has_gpus = bool((ctx.job.capacity or {}).get("gpus", True))
        for rank in range(spec.workers):
            error_file = str(store.error_path(job_id, rank))
            env = launcher.rank_environment(
                base,
                spec,
                rank,
                self.allocation["gpus"][rank],
                ports,
                job_id=job_id,
                restart=self.attempt,
                error_file=error_file,
                pool_has_gpus=pool_has_gpus,
            )
            env["MLCLUSTER_PAYLOAD"] = payload_path
            # The job's TensorBoard directory (README "TensorBoard"): --tensorboard or the
            # setting (resolved at submit), else the user's own --env, else the job store's.
            if spec.tensorboard:
                env["MLCLUSTER_TENSORBOARD_DIR"] = spec.tensorboard
            else:
                env.setdefault("MLCLUSTER_TENSORBOARD_DIR", str(tensorboard_dir))
            env["MLCLUSTER_ERROR_FILE"] = error_file
            env.update(self.tree.rank_env())
            env.update(self.forensics.rank_env(rank))
            if rank == 0:
                env["MLCLUSTER_RESULT_PATH"] = str(store.result_path(job_id))
                env["MLCLUSTER_MAX_RESULT_BYTES"] = str(ctx.config.max_result_mib * 1024 * 1024)
            if warm and rank == 0:
                # (the variables that matter are the same on every rank: the job's)
                cold_because = _stale_for_warm(env)
                warm = not cold_because
                if cold_because and self.attempt == 0:
                    preparing = _preparing_note()
                    ctx.logs.system(
                        "[mlcluster] started cold, not from the warm pool: its interpreter"
                        " imported with another environment than this job's: "
                        + ", ".join(cold_because)
                        + (f"; {preparing}" if preparing else ""),
                        rank=0,
                    )
            proc = self.spawn(rank, env, payload_path, warm)
            self.tree.adopt(proc.pid)
            self.ranks.append(proc)
            self._watch_exit(proc)
            for fd, stream in ((proc.stdout, "o"), (proc.stderr, "e"), (proc.control, "c")):
                os.set_blocking(fd, False)
                self.selector.register(fd, selectors.EVENT_READ, (rank, stream))
                # Records come only on the report pipe, signed by this rank: whatever the
                # rank prints on stdout/stderr is text, marker or not.
                self.parsers[(rank, stream)] = OutputParser(key if stream == "c" else None, rank)
                self.open_fds += 1
        now = time.time()
        ctx.set_ranks(
            {
                p.rank: {
                    "state": RankState.STARTING,
                    "pid": p.pid,
                    "process_start": p.create_time,
                    "host": "localhost",
                    "started": now,
                    "finished": None,
                    "exit_code": None,
                    "progress": None,
                }
                for p in self.ranks
            }
        )
        fields = {} if ctx.job.started else {"started": now}
        ctx.set_state(JobState.RUNNING, **fields)
        log.debug("ranks started")
        ctx.job.started = ctx.job.started or now
        self.forensics.started()

    def spawn(
        self, rank: int, env: dict[str, str], payload_path: str, warm: bool
    ) -> launcher.RankProcess:
        """Start one rank (a session's gang also hands each rank its command pipe)."""
        if warm:
            return launcher.spawn_forked(rank, env, self.launch.get("cwd"), payload_path)
        return launcher.spawn_cold(rank, env, self.launch.get("cwd"))

    def _watch_exit(self, proc: launcher.RankProcess) -> None:
        """Wake the loop the moment the rank exits (a pidfd turns readable then): its pipes'
        end-of-file can come just before it is reapable, and the loop would otherwise notice
        its exit only a LOOP_TICK later, on the job's critical path. Without pidfds (Linux <
        5.3, other systems) the tick does it, as before."""
        try:
            fd = os.pidfd_open(proc.pid)
        except (AttributeError, OSError):
            return
        self.selector.register(fd, selectors.EVENT_READ, (proc.rank, EXIT_STREAM))

    # -- output -------------------------------------------------------------------------

    def pump(self, timeout: float) -> None:
        if not self.selector.get_map():  # (a rank's pidfd alone still wakes us)
            time.sleep(timeout)
            return
        for key, _ in self.selector.select(timeout):
            rank, stream = key.data
            if stream == EXIT_STREAM:  # the rank exited: the caller's poll() reaps it now
                self.selector.unregister(key.fd)
                os.close(key.fd)
                continue
            if (rank, stream) not in self.parsers:
                self.on_readable(key.fd, stream)
                continue
            try:
                data = os.read(key.fd, 65536)
            except BlockingIOError:
                continue
            parser = self.parsers[(rank, stream)]
            if not data:
                self.selector.unregister(key.fd)
                os.close(key.fd)
                self.open_fds -= 1
                self._handle(rank, stream, parser.flush())
                continue
            self._handle(rank, stream, parser.feed(data))

    def _handle(self, rank: int, stream: str, items: Iterable[tuple[str, Any]]) -> None:
        for kind, value in items:
            self.forensics.stall.active(rank)
            if kind == "line":
                if stream == "c":
                    self.ctx.logs.unread_record(rank)
                    continue
                self.log_line(rank, stream, value)
            elif kind == "progress":
                self.rank_updates.update(rank, progress=lifecycle.clean_progress(value))
            elif kind == "control":
                rtype = value.get("type")
                if rtype == "started" and rank not in self.done:
                    self.rank_updates.update(rank, state=RankState.RUNNING)
                elif rtype == "progress":
                    self.rank_updates.update(rank, progress=lifecycle.clean_progress(value))
                elif rtype == "error":
                    self.reported_errors[rank] = value
                elif rtype == "failing":
                    self.forensics.on_failing(rank)
                else:
                    self.on_record(rank, value)

    def record_samples(self, samples: dict[int, dict[str, Any]]) -> None:
        self.ctx.record_metrics(samples)

    def on_readable(self, fd: int, stream: str) -> None:
        """A file a subclass registered in the selector (a session's FIFO) has news."""

    def log_line(self, rank: int, stream: str, text: str) -> None:
        self.ctx.logs.line(rank, stream, text)

    def on_record(self, rank: int, record: dict[str, Any]) -> None:
        """A signed report this class does not know (a session rank's cell reports)."""

    def flush(self, force: bool = False) -> None:
        now = time.monotonic()
        self.rank_updates.flush(force)
        if now - self.last_metrics >= self.ctx.config.metrics_interval:
            self.last_metrics = now
            samples = {}
            for p in self.ranks:
                if p.returncode is None:
                    sample = self.sampler.sample(p.pid, self.allocation["gpus"][p.rank])
                    if sample is not None:
                        samples[p.rank] = sample
            if samples:
                self.record_samples(samples)
                self.stall_outcome = self.stall_outcome or self.forensics.sampled(samples)
        if now - self.last_reap >= REAP_INTERVAL:
            self.last_reap = now
            self.tree.reap(p.pid for p in self.ranks)
        self.ctx.tick()

    # -- lifecycle ----------------------------------------------------------------------

    def run(self) -> Outcome:
        try:
            self.start()
            outcome = self.watch()
        except BaseException:
            launcher.stop_ranks(self.ranks, 0.0)
            self.end_tree()
            raise
        finally:
            self.forensics.close()
        # What the ranks started dies with the attempt (its pipes close, so drain is quick).
        self.end_tree()
        self.drain()
        return outcome

    def end_tree(self) -> None:
        self.tree.end_attempt([p.pid for p in self.ranks], keep=[p.pid for p in self.ranks])

    def drain_rank(self, rank: int) -> None:
        """Read what an exited rank wrote (all of it is in its pipes now) before it counts as
        finished: a finished rank's log is complete, even if the supervisor dies next."""
        for key in list(self.selector.get_map().values()):
            if key.data[0] != rank or key.data[1] == EXIT_STREAM:
                continue
            parser = self.parsers[key.data]
            for _ in range(RANK_DRAIN_CAP // 65536):
                try:
                    data = os.read(key.fd, 65536)
                except BlockingIOError:
                    break
                if not data:
                    self.selector.unregister(key.fd)
                    os.close(key.fd)
                    self.open_fds -= 1
                    self._handle(rank, key.data[1], parser.flush())
                    break
                self._handle(rank, key.data[1], parser.feed(data))

    def _reap_exits(self) -> None:
        """Note every rank that has exited since the last look (its output drained, its
        state set); a failed one is remembered with the time it was seen."""
        for p in self.ranks:
            if p.rank in self.done or p.poll() is None:
                continue
            self.done.add(p.rank)
            self.drain_rank(p.rank)
            ok = p.returncode == 0
            self.rank_updates.update(
                p.rank,
                state=RankState.SUCCEEDED if ok else RankState.FAILED,
                exit_code=p.returncode,
                finished=time.time(),
            )
            if not ok:
                self.failed_seen.setdefault(p.rank, time.time())

    def _failed_at(self, rank: int) -> float:
        """When the rank failed: its own report's timestamp (taken where the exception was
        caught, as torchrun's error files are), else when its exit was seen."""
        report = lifecycle.read_error_report(self.ctx.store, self.ctx.job.id, rank)
        report = report or self.reported_errors.get(rank)
        try:
            return float(report["timestamp"])  # type: ignore[index]
        except (TypeError, KeyError, ValueError):
            return self.failed_seen[rank]

    def _killed_unreported(self, rank: int) -> bool:
        code = self.ranks[rank].returncode
        return (
            code is not None
            and code < 0
            and rank not in self.reported_errors
            and lifecycle.read_error_report(self.ctx.store, self.ctx.job.id, rank) is None
        )

    def _fail_fast(self) -> Outcome:
        """A rank failed: stop the others, then name the rank that failed first by time.
        The rank seen first is not always it: a rank waiting in a collective fails too
        once the culprit's connections close ("Connection closed by peer"), and may exit
        (and be looked at) first. Such a follow-on failure is no cause: like every rank
        stopped on the culprit's account, it is marked cancelled and its log says why."""
        stopping = time.time()
        succeeded = {p.rank for p in self.ranks if p.rank in self.done and p.returncode == 0}
        where = self.forensics.before_stop("failed", exclude=set(self.failed_seen))
        self.stop("a rank failed")
        self._reap_exits()
        # Candidates: failures reported before the others were stopped (a rank that fails
        # from our SIGTERM is no candidate); among them, the earliest.
        when = {rank: self._failed_at(rank) for rank in self.failed_seen}
        candidates = {r: t for r, t in when.items() if t <= stopping} or when
        # A rank a signal ended before we stopped anything (kill -9, the OOM killer) left no
        # report: its peers' errors ("Connection closed by peer") are stamped before its
        # exit is even seen, yet follow from it. It is the culprit.
        culprit = min(candidates, key=lambda r: (not self._killed_unreported(r), candidates[r], r))
        outcome = Outcome(
            OutcomeKind.FAILED,
            lifecycle.reported_failure(culprit, self.reported_errors.get(culprit)),
            failed_rank=culprit,
            exit_code=self.ranks[culprit].returncode,
            where=where or None,
        )
        because = lifecycle.failure_text(self.ctx.store, self.ctx.job.id, outcome)
        now = time.time()
        for p in self.ranks:
            if p.rank == culprit or p.rank in succeeded:
                continue
            self.rank_updates.update(
                p.rank, state=RankState.CANCELLED, exit_code=p.returncode, finished=now
            )
            with contextlib.suppress(OSError):  # (a full disk: the job's error still says it)
                self.ctx.logs.system(
                    f"[mlcluster] rank {p.rank} was stopped because rank {culprit} failed first:"
                    f" {because}",
                    rank=p.rank,
                )
        return outcome

    def watch(self) -> Outcome:
        ctx = self.ctx
        finished = self.done
        while True:
            self.pump(LOOP_TICK)
            self._reap_exits()
            if self.failed_seen:
                return self._fail_fast()
            if len(finished) == len(self.ranks):
                log.debug("all ranks exited")
                return Outcome(OutcomeKind.SUCCEEDED)
            stop = lifecycle.stop_requested(ctx)
            if stop is not None:
                stop.where = self.forensics.before_stop(str(stop.kind)) or None
                return stop.with_reason(self.stop(stop.message or ""))
            self.flush()
            if self.stall_outcome is not None:  # --on-stall cancel (its stacks are kept)
                self.forensics.stopping = True
                return self.stall_outcome.with_reason(self.stop(self.stall_outcome.message or ""))

    def stop(self, why: str) -> str:
        """Stop every rank (fail-fast, cancel, timeout) as torchrun does: SIGTERM to each,
        SIGKILL after the grace; those still running are marked cancelled. Each rank's log
        says when and why (what it prints meanwhile follows there); returns what the job's
        reason adds: '' or which ranks had to be killed."""
        self.flush(force=True)
        grace = self.ctx.config.kill_grace_period
        live = [p.rank for p in self.ranks if p.poll() is None]
        for rank in live:
            with contextlib.suppress(OSError):  # (a full disk: the job's reason still says it)
                self.ctx.logs.system(
                    f"[mlcluster] stopping ({why}): SIGTERM, then SIGKILL after {grace:g} s",
                    rank=rank,
                )
        killed = launcher.stop_ranks(self.ranks, grace, pump=self.pump)
        for rank in killed:
            with contextlib.suppress(OSError):
                self.ctx.logs.system(
                    f"[mlcluster] rank {rank} had not exited {grace:g} s after SIGTERM: killed",
                    rank=rank,
                )
        now = time.time()
        for p in self.ranks:
            if p.rank in self.done:
                continue
            state = self.rank_updates.get(p.rank, "state")
            if state in (RankState.SUCCEEDED, RankState.FAILED):
                continue
            self.rank_updates.update(
                p.rank, state=RankState.CANCELLED, exit_code=p.returncode, finished=now
            )
        if not killed:
            return ""
        which = ", ".join(str(rank) for rank in killed)
        return f"; rank {which} had not exited {grace:g} s after SIGTERM and was killed"

    def drain(self) -> None:
        """Read what the ranks wrote before exiting (pipes may still hold output)."""
        deadline = time.monotonic() + DRAIN_TIMEOUT
        while self.open_fds and time.monotonic() < deadline:
            self.pump(0.05)
        for key in list(self.selector.get_map().values()):
            self.selector.unregister(key.fd)
            os.close(key.fd)
        self.selector.close()
        self.flush(force=True)
        self.ctx.logs.maybe_notify(force=True)


def _running_warm() -> bool:
    from ...jobs import warm

    return warm.in_zygote_child()


def _stale_for_warm(env: dict[str, str]) -> list[str]:
    """The variables a warm rank would see stale (jobs/warm/environment.py): the job starts cold."""
    from ...jobs import warm

    return warm.stale_variables(env)


def _preparing_note() -> str | None:
    """What the warm pool does for later jobs with this job's values (jobs/warm/zygote.py)."""
    from ...jobs import warm

    return warm.preparing_note()
