"""One attempt of a Slurm job: its sbatch allocation of N tasks, started in one srun step.

It writes its batch script and the job's variables into the attempt's directory (on the
filesystem the notebook shares with the nodes), submits it, follows it with squeue (Slurm's
pending reason is the job's reason), tails each rank's output, report and exit files
(rankfiles.py), and ends it with scancel: SIGTERM, then SIGKILL after `kill_grace_period`,
as the other backends stop their ranks. A session's allocation is one (session.py).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from ...jobs import lifecycle
from ...jobs.lifecycle import Outcome, OutcomeKind
from ...jobs.model import JobSpec, JobState, RankState
from ...runtime.atomic import write_whole
from ...runtime.protocol import OutputParser, job_key, key_path
from ...runtime.submitter_env import base_environment
from . import forensics, script, watch
from .cleanup import GONE_WAIT, PendingCleanup, current_slurm_user
from .commands import SlurmError
from .rankfiles import RankFiles
from .watch import Following, LostSlurm

if TYPE_CHECKING:
    from ...jobs.running.supervisor import JobContext
    from ...jobs.storage.series import SeriesWriter
    from .backend import SlurmBackend

log = logging.getLogger("jupyterlab_mlcluster.supervisor")

LOOP_TICK = 0.05
# What a rank's own figures hold, as the store records them (a session's cells use it too).
METRIC_FIELDS = ("cpu_percent", "memory_bytes", "gpu_util", "gpu_memory_bytes")
# Variables of the notebook's own Slurm allocation (batchspawner, Open OnDemand): a job's
# sbatch must not inherit them, or its tasks would think they were the notebook's.
_KEEP_SLURM = {"SLURM_CONF"}


class Attempt:
    """One sbatch allocation: submit, follow, stream, stop."""

    def __init__(self, backend: SlurmBackend, ctx: JobContext, launch: dict[str, Any], number: int):
        self.backend = backend
        self.ctx = ctx
        self.spec: JobSpec = ctx.job.spec
        self.launch = launch
        self.number = number
        self.commands = backend.commands()
        self.dir = ctx.store.job_dir(ctx.job.id) / "slurm" / f"attempt-{number}"
        self.slurm_id: str | None = None
        self.slurm_state = "PENDING"
        self.running = False
        self.rank_updates = lifecycle.RankUpdates(ctx, series=self.series_now)
        self.cleanup = PendingCleanup(ctx.store, ctx.job.id)
        key = job_key(key_path(str(ctx.store.payload_path(ctx.job.id))))
        self.rank_files = RankFiles(self.dir, self.spec.workers, key)
        self.exits: dict[int, int] = {}
        self.started_ranks: set[int] = set()
        self.view: Following | None = None
        self.released = False
        self.host: str | None = None
        self.reported_errors: dict[int, dict[str, Any]] = {}
        self.runtime_metrics: dict[int, dict[str, Any]] = {}
        self.last_metrics = float("-inf")
        self.forensics = forensics.AttemptForensics(self)
        self.stalled: Outcome | None = None  # --on-stall cancel's

    def series_now(self) -> SeriesWriter:
        """Where the ranks' logged points go now (a session's: its running cell's)."""
        return self.ctx.series

    # -- submit ------------------------------------------------------------------------

    def sbatch_environment(self) -> dict[str, str]:
        """What sbatch itself runs with (and, through --export=ALL, what each task starts
        with): the submitter's environment less launcher and Slurm variables
        (`base_environment`). Never the job's own `env`: sbatch runs on the
        submitter's host with the submitter's credentials, where a job's LD_PRELOAD, SLURM_CONF
        or SBATCH_* would act on the submission itself; those reach the tasks through the
        job's variables file (`job_variables`, read by backends/slurm/rank.py)."""
        env = {
            k: v
            for k, v in base_environment(self.launch.get("env", {})).items()
            if not k.startswith(("SLURM_", "SBATCH_", "SRUN_", "SALLOC_")) or k in _KEEP_SLURM
        }
        if "SLURM_CONF" in os.environ:  # the supervisor's (the cluster this backend talks to)
            env["SLURM_CONF"] = os.environ["SLURM_CONF"]
        env["PYTHONUNBUFFERED"] = "1"
        return env

    def job_variables(self, base: dict[str, str]) -> dict[str, str]:
        """What each task adds to the environment sbatch gave it (`base`): the job's own
        `env` and the rank variables of this attempt, as a local rank gets them."""
        store, job_id, spec = self.ctx.store, self.ctx.job.id, self.spec
        env = dict(spec.env)
        env.update(
            {
                "TORCHELASTIC_RESTART_COUNT": str(self.number),
                "TORCHELASTIC_MAX_RESTARTS": str(spec.max_restarts),
                "TORCHELASTIC_RUN_ID": job_id,
                "TORCHELASTIC_USE_AGENT_STORE": "False",
                "PYTHONUNBUFFERED": "1",
                "MLCLUSTER_JOB_ID": job_id,
                "MLCLUSTER_PAYLOAD": str(store.payload_path(job_id)),
                "MLCLUSTER_SLURM_ERROR_FILES": str(store.job_dir(job_id) / "error-{rank}.json"),
                "MLCLUSTER_SLURM_RESULT_PATH": str(store.result_path(job_id)),
            }
        )
        if self.ctx.config.stacks_helper and self.forensics.enabled:
            env[script.STACKS_HELPER_VARIABLE] = "1"
        if "TORCH_NCCL_ASYNC_ERROR_HANDLING" not in base:
            env.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
        if "OMP_NUM_THREADS" not in env and "OMP_NUM_THREADS" not in base:
            env["OMP_NUM_THREADS"] = str(script.cpus_per_task(spec))
        if spec.tensorboard:
            env["MLCLUSTER_TENSORBOARD_DIR"] = spec.tensorboard
        elif "MLCLUSTER_TENSORBOARD_DIR" not in env and "MLCLUSTER_TENSORBOARD_DIR" not in base:
            tensorboard = store.tensorboard_dir(job_id)
            tensorboard.mkdir(mode=0o700, exist_ok=True)
            env["MLCLUSTER_TENSORBOARD_DIR"] = str(tensorboard)
        return env

    def submit(self) -> None:
        ctx = self.ctx
        self.dir.mkdir(parents=True, exist_ok=True)
        python = ctx.config.slurm_python or sys.executable
        base = self.sbatch_environment()
        # The job's variables reach its tasks through a file of the attempt (owner-only),
        # never through sbatch's environment (see sbatch_environment).
        write_whole(script.variables_file(str(self.dir)), json.dumps(self.job_variables(base)))
        job_script = self.dir / "job.sh"
        job_script.write_text(
            script.batch_script(python=python, attempt_dir=str(self.dir), spec=self.spec)
        )
        args = self.backend._sbatch_arguments(
            self.spec, job_id=ctx.job.id, attempt_dir=str(self.dir)
        )
        self.cleanup.submitting()
        self.slurm_id = self.commands.submit(args, str(job_script), base)
        since = time.time()  # an answer asked before sbatch returned may not know the job
        self.cleanup.submitted(self.slurm_id)
        watcher = watch.watch_for(
            ctx.store.root, self.commands, ctx.config.slurm_poll_interval, current_slurm_user()
        )
        self.view = Following(
            watcher, self.slurm_id, self.spec.queue or ctx.config.slurm_partition, since
        )
        log.info("attempt %d is Slurm job %s", self.number, self.slurm_id)
        ctx.set_reason(f"submitted to Slurm as job {self.slurm_id}")
        unset = dict.fromkeys(("finished", "exit_code", "progress", "started", "pid"))
        ctx.set_all_ranks(state=RankState.PENDING, **unset)

    # -- follow ------------------------------------------------------------------------

    def look(self) -> None:
        """The Slurm job's state as squeue last said it (the user's watcher asks); pending
        reason and position; nodes once running."""
        if self.view is None:
            return
        row, position = self.view.latest()
        if row is None:  # no answer yet
            return
        if not row:  # Slurm forgot it (MinJobAge passed): it ended
            if self.slurm_state in script.ACTIVE_STATES:
                self.slurm_state = "GONE"
            return
        self.slurm_state = row["state"]
        if row["state"] == "PENDING":
            reason = script.pending_reason(row["reason"])
            if position is not None:
                reason += f"; position {position} in Slurm's queue"
            self.ctx.set_reason(reason)
        elif row["state"] in ("RUNNING", "COMPLETING") and (not self.running or not self.host):
            self._running(row["nodes"])

    def _running(self, nodes: str | None) -> None:
        """The allocation runs: squeue said so, or a rank already did (its report or its
        exit can come before squeue's next answer). Ranks that reported or ended keep their
        state; the others are starting. The nodes, once squeue names them, are the ranks'
        host (one node), else the allocation's node list."""
        ctx = self.ctx
        if nodes and nodes != "(null)" and self.host is None:
            self.host = script.first_host(nodes) if "," not in nodes and "[" not in nodes else nodes
            for rank in range(self.spec.workers):
                self.rank_updates.update(rank, host=self.host)
        if self.running:
            return
        self.running = True
        now = time.time()
        for rank in range(self.spec.workers):
            fields: dict[str, Any] = {"started": now}
            if rank not in self.started_ranks and rank not in self.exits:
                fields["state"] = RankState.STARTING
            self.rank_updates.update(rank, **fields)
        self.rank_updates.flush(force=True)
        fields = {} if ctx.job.started else {"started": now}
        ctx.set_state(JobState.RUNNING, reason=None, **fields)
        ctx.job.started = ctx.job.started or now

    def pump(self, force: bool = False) -> None:
        """New output, reports and exits of every rank, when its files are due a look
        (rankfiles.py; `force`: now)."""
        if not self.rank_files.due(force):
            return
        for rank, stream, items in self.rank_files.news():
            self._handle(rank, stream, items)
        for rank in range(self.spec.workers):
            if rank in self.exits:
                continue
            code = self.rank_files.exit_code(rank)
            if code is None:
                continue
            self._drain_rank(rank)
            self.exits[rank] = code
            self.rank_updates.update(
                rank,
                state=RankState.SUCCEEDED if code == 0 else RankState.FAILED,
                exit_code=code,
                finished=time.time(),
            )
        if not self.running and (self.started_ranks or self.exits):
            self._running(None)

    @property
    def parsers(self) -> dict[tuple[int, str], OutputParser]:
        """Each rank stream's parser (a session flushes them at a cell's end)."""
        return self.rank_files.parsers

    def _drain_rank(self, rank: int) -> None:
        for stream, items in self.rank_files.rest(rank):
            self._handle(rank, stream, items)

    def _handle(self, rank: int, stream: str, items: Iterable[tuple[str, Any]]) -> None:
        for kind, value in items:
            if kind == "line":
                if stream != "c":
                    self.ctx.logs.line(rank, stream, value)
                    self.forensics.active(rank)
                else:
                    self.ctx.logs.unread_record(rank)
            elif kind == "progress":
                self.rank_updates.update(rank, progress=lifecycle.clean_progress(value))
                self.forensics.active(rank)
            elif kind == "control":
                rtype = value.get("type")
                if rtype == "started" and rank not in self.exits:
                    self.started_ranks.add(rank)
                    self.rank_updates.update(rank, state=RankState.RUNNING, pid=value.get("pid"))
                    self.forensics.active(rank)
                elif rtype == "progress":
                    self.rank_updates.update(rank, progress=lifecycle.clean_progress(value))
                    self.forensics.active(rank)
                elif rtype == "error":
                    self.reported_errors[rank] = value
                elif rtype == "metrics":  # the rank's own figures (rank.py): nobody samples it
                    self.runtime_metrics[rank] = {k: value.get(k) for k in METRIC_FIELDS}

    def flush(self, force: bool = False) -> None:
        self.rank_updates.flush(force)
        now = time.monotonic()
        if self.runtime_metrics and now - self.last_metrics >= self.ctx.config.metrics_interval:
            self.last_metrics = now
            samples, self.runtime_metrics = self.runtime_metrics, {}
            self.ctx.record_metrics(samples)  # the monitor's columns, and the idle-GPU flag
            self.stalled = self.stalled or self.forensics.sampled(samples)
        self.ctx.tick()

    def watch(self) -> Outcome:
        ctx, spec = self.ctx, self.spec
        ended_seen = False
        while True:
            self.pump()
            failed = sorted(r for r, code in self.exits.items() if code != 0)
            if failed:
                # The first rank that failed (its error report's time), as torchrun says.
                rank = min(failed, key=self._failure_time)
                where = self.forensics.before_stop("failed")
                self.stop("a rank failed")
                verdict = self._slurm_verdict(where)
                if verdict is not None:  # Slurm took the allocation away: its reason
                    return verdict
                return Outcome(
                    OutcomeKind.FAILED,
                    lifecycle.reported_failure(rank, self.reported_errors.get(rank)),
                    failed_rank=rank,
                    exit_code=self.exits[rank],
                    where=where or None,
                )
            if len(self.exits) == spec.workers:
                return Outcome(OutcomeKind.SUCCEEDED)
            stop = lifecycle.stop_requested(ctx) or self.stalled
            if stop is not None:
                if stop.where is None:
                    stop.where = self.forensics.before_stop(str(stop.kind)) or None
                self.forensics.stopping = True
                return stop.with_reason(self.stop(stop.message or ""))
            self.look()
            if self.slurm_state not in script.ACTIVE_STATES:
                if ended_seen:  # one more turn read what the ranks left: still not all
                    return self._ended()
                ended_seen = True
                self.pump(force=True)
                continue
            self.flush()
            time.sleep(LOOP_TICK)

    def _slurm_verdict(self, where: str | None) -> Outcome | None:
        """Slurm's own reason when it ended the allocation (a preemption, its time limit, a
        node's failure): the ranks then exit on its SIGTERM, saving what they can (sbatch
        --signal, the partition's GraceTime), and the exit of the first is no cause. Asked
        once the allocation is gone (`stop` waits for it)."""
        if self.slurm_state not in script.SLURM_ENDED:
            return None
        kind, message = script.job_outcome(self.slurm_state) or ("failed", self.slurm_state)
        self._mark_unfinished(RankState.CANCELLED)
        return Outcome(
            OutcomeKind(kind), message, restartable=kind == OutcomeKind.FAILED, where=where
        )

    def _failure_time(self, rank: int) -> float:
        report = lifecycle.read_error_report(self.ctx.store, self.ctx.job.id, rank) or {}
        return float(report.get("timestamp") or float("inf"))

    def _ended(self) -> Outcome:
        """The Slurm job ended before every rank said how it ended: why, in Slurm's terms."""
        self.pump(force=True)
        self._mark_unfinished(RankState.CANCELLED)
        known = script.job_outcome(self.slurm_state)
        if known is not None:
            kind, message = known
            return Outcome(OutcomeKind(kind), message, restartable=kind == OutcomeKind.FAILED)
        batch_output = self.rank_files.batch_output()
        culprit = script.srun_task_failure(batch_output)
        if culprit is not None:  # srun's word: "task 1: Killed"
            rank, how = culprit
            self.rank_updates.update(rank, state=RankState.FAILED)
            self.flush(force=True)
            return Outcome(
                OutcomeKind.FAILED,
                f"rank {rank} failed: srun: task {rank}: {how}",
                failed_rank=rank,
            )
        missing = [r for r in range(self.spec.workers) if r not in self.exits]
        first_missing = missing[0] if missing else None
        last = [line for line in batch_output.splitlines() if line.strip()][-1:]
        return Outcome(
            OutcomeKind.FAILED,
            f"Slurm job {self.slurm_id} ended ({self.slurm_state}) before rank {first_missing} "
            "did: " + (last[0].strip() if last else f"see {self.dir / 'batch.out'}"),
            failed_rank=first_missing,
        )

    def _mark_unfinished(self, state: RankState) -> None:
        now = time.time()
        for rank in range(self.spec.workers):
            if rank not in self.exits:
                self.rank_updates.update(rank, state=state, finished=now)
        self.flush(force=True)

    # -- stop --------------------------------------------------------------------------

    def stop(self, why: str) -> str:
        """SIGTERM to every task, SIGKILL after the grace (kill_grace_period, or the job's
        --grace), then the allocation cancelled (a pending one at once), as the local backend
        stops its ranks: each rank's log says when and why; the ranks that had not ended are
        marked cancelled. Returns what the job's reason adds: '' or which ranks were killed."""
        if self.slurm_id is None:
            return ""
        ended_before = set(self.exits)
        self.flush(force=True)
        grace = self.ctx.config.kill_grace_period
        killed: list[int] = []
        if self.running:
            live = [r for r in range(self.spec.workers) if r not in self.exits]
            self._say(
                live, f"[mlcluster] stopping ({why}): SIGTERM, then SIGKILL after {grace:g} s"
            )
            try:
                self.commands.signal(self.slurm_id, "TERM")
            except SlurmError as exc:
                log.warning("scancel --signal=TERM %s: %s", self.slurm_id, exc)
            if not self.wait_gone(grace, tasks_only=True):
                killed = [r for r in live if r not in self.exits]
                self._say(
                    killed,
                    f"[mlcluster] rank {{rank}} had not exited {grace:g} s after SIGTERM: killed",
                )
                try:
                    self.commands.signal(self.slurm_id, "KILL", full=True)
                except SlurmError as exc:
                    log.warning("scancel --signal=KILL %s: %s", self.slurm_id, exc)
        self.cancel_allocation()
        now = time.time()
        for rank in range(self.spec.workers):
            if rank not in ended_before:
                self.rank_updates.update(
                    rank, state=RankState.CANCELLED, exit_code=self.exits.get(rank), finished=now
                )
        self.flush(force=True)
        if not killed:
            return ""
        which = ", ".join(str(rank) for rank in killed)
        return f"; rank {which} had not exited {grace:g} s after SIGTERM and was killed"

    def _say(self, ranks: list[int], text: str) -> None:
        for rank in ranks:
            with contextlib.suppress(OSError):  # (a full disk: the job's reason still says it)
                self.ctx.logs.system(text.replace("{rank}", str(rank)), rank=rank)

    def cancel_allocation(self) -> None:
        if self.slurm_id is None or self.slurm_state not in script.ACTIVE_STATES:
            return  # (its callers have a Slurm job id: nothing to cancel without one)
        try:
            self.commands.cancel([self.slurm_id])
        except SlurmError as exc:
            log.warning("scancel %s: %s", self.slurm_id, exc)
        self.wait_gone(GONE_WAIT)

    def wait_gone(self, timeout: float, *, tasks_only: bool = False) -> bool:
        """Wait (pumping output) until every task exited (`tasks_only`) or Slurm has let the
        job go; whether it happened in time."""
        deadline = time.monotonic() + timeout
        while True:
            self.pump()
            if tasks_only and self._tasks_done():
                return True
            if self.view is not None:
                self.view.refresh()
            with contextlib.suppress(LostSlurm):  # (the caller is stopping it anyway)
                self.look()
            if (
                self.slurm_state not in script.ACTIVE_STATES
                or self.slurm_state == "COMPLETING"
                and tasks_only
            ):
                return True
            if time.monotonic() >= deadline:
                return False
            self.flush()
            time.sleep(min(0.2, self.ctx.config.slurm_poll_interval))

    def _tasks_done(self) -> bool:
        return len(self.exits) == self.spec.workers

    # -- lifecycle ---------------------------------------------------------------------

    def run(self) -> Outcome:
        """Submit, follow to an outcome, end: the order a session's allocation keeps too
        (its `follow`, `let_go` and `ended` serve cells instead)."""
        try:
            self.submit()
        except SlurmError as exc:
            return Outcome(OutcomeKind.FAILED, f"sbatch: {exc}", restartable=False)
        try:
            outcome = self.follow()
        except LostSlurm as exc:
            why = f"lost contact with Slurm: {exc}"
            return Outcome(OutcomeKind.FAILED, why + self.stop(why), restartable=False)
        except BaseException:
            self.stop("the supervisor failed")
            raise
        finally:
            self.let_go()
        return self.ended(outcome)

    def follow(self) -> Outcome:
        return self.watch()

    def let_go(self) -> None:
        """What the attempt holds besides the allocation, released however it ended."""

    def ended(self, outcome: Outcome) -> Outcome:
        self.pump(force=True)
        self.flush(force=True)
        self.ctx.logs.maybe_notify(force=True)
        if outcome.kind == OutcomeKind.SUCCEEDED:
            self.cleanup.ranks_ended()
        return outcome

    def release(self) -> None:
        """Wait until Slurm has let the allocation go (cancelling it if it still runs), then
        clear the job's pending cleanup; one left pending is the reaper's."""
        if self.slurm_id is None or self.released:
            return
        self.released = True
        if not self.wait_gone(GONE_WAIT) and self.slurm_state != "COMPLETING":
            self.cancel_allocation()
        if self.view is not None:
            self.view.stop()
        if self.slurm_state not in script.ACTIVE_STATES:
            self.cleanup.done()
