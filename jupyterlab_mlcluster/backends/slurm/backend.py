"""The Slurm backend: a job is one sbatch allocation of N tasks, started in one srun step.

In the submitting process: `validate` asks Slurm itself (`sbatch --test-only`) so a job it
would refuse is refused, in its words, before anything is stored; `capacity` reads sinfo.
Inside the supervisor: each attempt writes its batch script into the job's directory (on
the filesystem the notebook shares with the nodes), submits it, follows it with squeue
(Slurm's pending reason is the job's reason), tails each rank's output, report and exit
files, and ends it with scancel: SIGTERM, then SIGKILL after `kill_grace_period`, as the
other backends stop their ranks. The reaper cancels what a dead supervisor left, found by
the comment every allocation of ours carries.

Its pure builders and parsers are script.py; its calls of sbatch, squeue, scancel and sinfo
are commands.py.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...jobs import lifecycle
from ...jobs.backend import Backend
from ...jobs.lifecycle import Outcome, OutcomeKind
from ...jobs.model import JobSpec, JobState, RankState, SpecError
from ...jobs.sessions import is_session_holder
from ...runtime.atomic import write_whole
from ...runtime.protocol import OutputParser, job_key, key_path
from ...runtime.submitter_env import base_environment
from . import forensics, script, watch
from .commands import SlurmCommands, SlurmError
from .watch import LOOK_BACKOFF, Following, LostSlurm

if TYPE_CHECKING:
    from ...jobs.running.supervisor import JobContext
    from ...jobs.storage.series import SeriesWriter
    from ...jobs.storage.store import JobStore

log = logging.getLogger("jupyterlab_mlcluster.supervisor")

LOOP_TICK = 0.05
# After scancel, how long the supervisor waits for Slurm to let the job go before it says so
# and leaves the rest to the reaper (a pending cleanup stays recorded).
GONE_WAIT = 60.0
READ_CAP = 1 << 20  # bytes read from one rank file per turn
SCAN_EVERY = 0.05  # seconds between looks at the rank files, per 8 ranks
SCAN_MAX = 1.0
SINFO_TTL = 1.0
# A job whose ranks all exited: how long its allocation may take to end on its own before
# the reaper cancels it, and how often the reaper looks meanwhile.
ENDING_GRACE = GONE_WAIT
ENDING_LOOK = 2.0
PENDING_CLEANUP = "pending_cleanup"
_METRICS = ("cpu_percent", "memory_bytes", "gpu_util", "gpu_memory_bytes")
# Variables of the notebook's own Slurm allocation (batchspawner, Open OnDemand): a job's
# sbatch must not inherit them, or its tasks would think they were the notebook's.
_KEEP_SLURM = {"SLURM_CONF"}


class SlurmBackend(Backend):
    name = "slurm"
    # Cancel, a failing rank and a timeout are SIGTERM, then SIGKILL after the job's grace.
    honours_grace = True

    def commands(self) -> SlurmCommands:
        return SlurmCommands(self.config.slurm_bin_dir, self.config.slurm_command_timeout)

    watches_stalls = True

    def collect_stacks(self, store: JobStore, job, ranks: list[int] | None, native: bool):
        """py-spy on the ranks' processes where they are on this machine, else their own
        helper woken through scancel --signal=USR2 (forensics.py)."""
        return forensics.read_stacks(
            self.commands(),
            self.config,
            job,
            (job.backend_state or {}).get("slurm_job_id"),
            forensics.latest_attempt_dir(store, job.id),
            ranks,
            native=native,
        )

    def validate(self, spec: JobSpec) -> None:
        if spec.workers > self.config.max_workers:
            raise SpecError(
                f"workers must be at most {self.config.max_workers} (MLClusterConfig.max_workers)"
            )
        args = self._sbatch_arguments(spec, job_id="validate", attempt_dir=tempfile.gettempdir())
        try:
            self.commands().test_only(args)
        except SlurmError as exc:
            raise SpecError(f"Slurm refuses the job: {exc}") from None

    def _sbatch_arguments(self, spec: JobSpec, *, job_id: str, attempt_dir: str) -> list[str]:
        c = self.config
        return script.sbatch_arguments(
            spec,
            job_id=job_id,
            attempt_dir=attempt_dir,
            partition=c.slurm_partition,
            account=c.slurm_account,
            qos_by_priority=dict(c.slurm_priority_qos),
            extra_args=list(c.slurm_extra_args),
            grace=c.kill_grace_period,
        )

    def partitions(self) -> dict[str, dict[str, Any]]:
        """sinfo per partition; one answer serves for SINFO_TTL (GET /cluster asks for the
        capacity and the partitions together, the event feed on every job state change)."""
        now = time.monotonic()
        cached = getattr(self, "_sinfo", None)
        if cached is not None and now - cached[0] < SINFO_TTL:
            return cached[1]
        partitions = script.parse_sinfo(self.commands().sinfo())
        self._sinfo = (now, partitions)
        return partitions

    def _partition(self, partitions: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
        name = self.config.slurm_partition
        if name:
            return partitions.get(name)
        return next((p for p in partitions.values() if p["default"]), None)

    def capacity(self) -> dict[str, Any]:
        """The job's partition's totals from sinfo, in the store's shape."""
        try:
            part = self._partition(self.partitions())
        except SlurmError as exc:
            log.warning("sinfo: %s", exc)
            part = None
        if part is None:
            return {"cpus": 0, "gpus": [], "memory": 0}
        return {
            "cpus": part["cpus_total"],
            "gpus": list(range(part["gpus_total"])),
            "memory": part["memory_mb"] << 20,
        }

    def cluster_capacity(self) -> dict[str, Any] | None:
        """GET /cluster: the default partition's CPUs and GPUs, total and idle (sinfo), and
        every partition's; unknown (nulls) where sinfo cannot be asked."""
        try:
            partitions = self.partitions()
        except SlurmError as exc:
            log.warning("sinfo: %s", exc)
            unknown = {"total": None, "free": None}
            return {
                "capacity": {"gpus": unknown, "cpus": unknown, "memory": unknown},
                "partitions": [],
            }
        part = self._partition(partitions) or {
            "memory_free_mb": 0,
            "cpus_total": 0,
            "cpus_idle": 0,
            "gpus_total": 0,
            "gpus_idle": 0,
            "memory_mb": 0,
        }
        return {
            "capacity": {
                "gpus": {"total": part["gpus_total"], "free": part["gpus_idle"]},
                "cpus": {"total": part["cpus_total"], "free": part["cpus_idle"]},
                "memory": {"total": part["memory_mb"] << 20, "free": part["memory_free_mb"] << 20},
            },
            "partitions": [
                {
                    "name": name,
                    "default": p["default"],
                    "nodes": p["nodes"],
                    "cpus": {"total": p["cpus_total"], "free": p["cpus_idle"]},
                    "gpus": {"total": p["gpus_total"], "free": p["gpus_idle"]},
                }
                for name, p in sorted(partitions.items())
            ],
        }

    # -- after a supervisor died -----------------------------------------------------------

    def cleanup_orphans(self, store: JobStore, job) -> None:
        """Cancel every allocation of the job Slurm still runs or queues (found by comment:
        also one whose id the supervisor never got to record); the cleanup stays pending,
        retried on the reaper's later passes with backoff, until Slurm has none left. A job
        whose ranks all exited (record_end) is only watched ending, not cancelled, for
        ENDING_GRACE."""
        state = dict(store.get_job(job.id).backend_state or {})
        pending = dict(state.get(PENDING_CLEANUP) or {"since": time.time()})
        if pending.get("next_attempt", 0) > time.time():
            return
        # Its ranks all exited (record_end): the allocation is ending on its own; it is
        # only cancelled if it outlives ENDING_GRACE (a task that never exits).
        ending = time.time() < float(pending.get("ended") or 0) + ENDING_GRACE
        commands = self.commands()
        try:
            rows = script.ours(self._user_jobs(store, commands, pending), job.id)
            active = [r["id"] for r in rows if r["state"] in script.ACTIVE_STATES]
            if active and not ending:
                commands.cancel(active)
                log.warning("job %s: cancelled its Slurm job(s) %s", job.id, ", ".join(active))
                rows = script.ours(commands.jobs(job_ids=active), job.id)
                active = [r["id"] for r in rows if r["state"] in script.ACTIVE_STATES]
            gone = not active
        except SlurmError as exc:
            log.warning("job %s: cannot cancel its Slurm allocation yet: %s", job.id, exc)
            gone = False
        if gone:
            state.pop(PENDING_CLEANUP, None)
        elif ending:
            pending["next_attempt"] = time.time() + ENDING_LOOK
        else:
            attempts = int(pending.get("attempts", 0)) + 1
            pending.update(
                attempts=attempts, next_attempt=time.time() + LOOK_BACKOFF.delay(attempts)
            )
            state[PENDING_CLEANUP] = pending
        store.update_job(job.id, backend_state=state)

    def _user_jobs(
        self, store: JobStore, commands: SlurmCommands, pending: dict[str, Any]
    ) -> list[dict[str, str]]:
        """The user's jobs as Slurm says them: the watcher's snapshot (watch.py) when it is
        fresh and was asked after the job's allocation was submitted, else squeue asked here
        (no supervisor follows a Slurm job: nobody watches)."""
        user = current_slurm_user()
        snapshot = watch.read_snapshot(watch.snapshot_path(store.root, user)) or {}
        asked = float(snapshot.get("asked_at") or 0)
        fresh = time.time() - asked < max(3 * self.config.slurm_poll_interval, 3.0)
        if fresh and asked > float(pending.get("since") or 0) and not snapshot.get("failures"):
            return list((snapshot.get("jobs") or {}).values())
        return commands.jobs(user=user)

    # -- inside the supervisor -------------------------------------------------------------

    def run(self, ctx: JobContext) -> None:
        if is_session_holder(ctx.job):  # cells on an allocation that lives (session.py)
            from .session import serve_session

            serve_session(self, ctx)
            return
        launch = ctx.store.read_launch(ctx.job.id)
        attempts: list[_Attempt] = []

        def attempt(number: int) -> Outcome:
            if attempts:  # a restart: the previous allocation is gone first
                attempts[-1].release()
            attempts.append(_Attempt(self, ctx, launch, number))
            return attempts[-1].run()

        try:
            lifecycle.run_attempts(ctx, attempt)
        finally:
            # The job is final once its ranks are: the allocation's own end (Slurm's step
            # cleanup, epilog) is waited for after, off the job's critical path.
            if attempts:
                attempts[-1].release()


def current_slurm_user() -> str:
    """The Unix user whose Slurm jobs these are (not $MLCLUSTER_USER: Slurm knows uids)."""
    import pwd

    return pwd.getpwuid(os.getuid()).pw_name


def _set_backend_state(ctx: JobContext, **fields: Any) -> None:
    state = dict(ctx.store.get_job(ctx.job.id).backend_state or {})
    for key, value in fields.items():
        if value is None:
            state.pop(key, None)
        else:
            state[key] = value
    ctx.store.update_job(ctx.job.id, backend_state=state)


class _RankFile:
    """One rank's output, report or exit file, read as it grows."""

    def __init__(self, path: str):
        self.path = path
        self.offset = 0

    def read(self) -> bytes:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read(READ_CAP)
        except FileNotFoundError:
            return b""
        self.offset += len(data)
        return data


class _Attempt:
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
        key = job_key(key_path(str(ctx.store.payload_path(ctx.job.id))))
        self.files: dict[tuple[int, str], _RankFile] = {}
        self.parsers: dict[tuple[int, str], OutputParser] = {}
        for rank in range(self.spec.workers):
            for stream, suffix in script.RANK_STREAMS.items():
                self.files[(rank, stream)] = _RankFile(
                    script.rank_file(str(self.dir), rank, suffix)
                )
                self.parsers[(rank, stream)] = OutputParser(key if stream == "c" else None, rank)
        self.exits: dict[int, int] = {}
        self.started_ranks: set[int] = set()
        self.view: Following | None = None
        self.released = False
        self.host: str | None = None
        self.last_scan = float("-inf")
        self.scan_interval = min(SCAN_MAX, SCAN_EVERY * max(1.0, self.spec.workers / 8))
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
        # Recorded before sbatch: if this process dies before it learns the Slurm job id,
        # the reaper still cancels the allocation (found by its comment).
        _set_backend_state(ctx, **{PENDING_CLEANUP: {"since": time.time()}})
        self.slurm_id = self.commands.submit(args, str(job_script), base)
        since = time.time()  # an answer asked before sbatch returned may not know the job
        _set_backend_state(ctx, slurm_job_id=self.slurm_id)
        watcher = watch.watch_for(
            ctx.store.root, self.commands, ctx.config.slurm_poll_interval, current_slurm_user()
        )
        self.view = Following(
            watcher, self.slurm_id, self.spec.queue or ctx.config.slurm_partition, since
        )
        log.info("attempt %d is Slurm job %s", self.number, self.slurm_id)
        ctx.set_reason(f"submitted to Slurm as job {self.slurm_id}")
        ctx.set_ranks(
            {
                r: {
                    "state": RankState.PENDING,
                    "finished": None,
                    "exit_code": None,
                    "progress": None,
                    "started": None,
                    "pid": None,
                }
                for r in range(self.spec.workers)
            }
        )

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
        """New output, reports and exits of every rank. Each look opens every rank's files
        afresh (on NFS only an open revalidates a file: close-to-open consistency), so a big
        job is looked at less often (SCAN_EVERY per 8 ranks, at most SCAN_MAX apart) not to
        flood the shared filesystem's server; `force`: now."""
        now = time.monotonic()
        if not force and now - self.last_scan < self.scan_interval:
            return
        self.last_scan = now
        for (rank, stream), f in self.files.items():
            data = f.read()
            if data:
                self._handle(rank, stream, self.parsers[(rank, stream)].feed(data))
        for rank in range(self.spec.workers):
            if rank in self.exits:
                continue
            code = _read_exit(script.rank_file(str(self.dir), rank, "exit"))
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

    def _drain_rank(self, rank: int) -> None:
        for stream in script.RANK_STREAMS:
            f, parser = self.files[(rank, stream)], self.parsers[(rank, stream)]
            while data := f.read():
                self._handle(rank, stream, parser.feed(data))

    def _handle(self, rank: int, stream: str, items) -> None:
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
                    self.runtime_metrics[rank] = {k: value.get(k) for k in _METRICS}

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
        batch_output = _tail(self.dir / "batch.out")
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
            try:
                self.look()
            except LostSlurm:
                pass
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
        try:
            self.submit()
        except SlurmError as exc:
            return Outcome(OutcomeKind.FAILED, f"sbatch: {exc}", restartable=False)
        try:
            outcome = self.watch()
        except LostSlurm as exc:
            why = f"lost contact with Slurm: {exc}"
            return Outcome(OutcomeKind.FAILED, why + self.stop(why), restartable=False)
        except BaseException:
            self.stop("the supervisor failed")
            raise
        self.pump(force=True)
        self.flush(force=True)
        self.ctx.logs.maybe_notify(force=True)
        if outcome.kind == OutcomeKind.SUCCEEDED:
            self.record_end()
        return outcome

    def record_end(self) -> None:
        """Every rank exited on its own: recorded before the job is final, so that the
        allocation's own end (the step's teardown, the ranks' interpreters exiting, an epilog)
        is never taken for a leftover by the reaper of any front end (cleanup_orphans waits
        for it, ENDING_GRACE at most, instead of cancelling the step of a job that
        succeeded)."""
        state = self.ctx.store.get_job(self.ctx.job.id).backend_state or {}
        pending = dict(state.get(PENDING_CLEANUP) or {"since": time.time()})
        pending["ended"] = time.time()
        _set_backend_state(self.ctx, **{PENDING_CLEANUP: pending})

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
            _set_backend_state(self.ctx, **{PENDING_CLEANUP: None})


def _tail(path: Path, limit: int = 16384) -> str:
    """The last `limit` bytes of a file (the batch script's output: srun's messages)."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - limit))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


def _read_exit(path: str) -> int | None:
    try:
        return int(Path(path).read_text().strip())
    except (FileNotFoundError, ValueError):
        return None
