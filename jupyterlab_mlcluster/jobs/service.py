"""JobService: the one API every front end calls (magic, CLI, REST, Python API).

It validates and stores a job, starts its supervisor, and answers questions about jobs
from the store. It never drives a backend itself (supervisors do), so any number of
processes can hold a JobService on the same store at once.
"""

from __future__ import annotations

import builtins
import contextlib
import dataclasses
import json
import logging
import os
import secrets
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, BinaryIO

from ..config import MLClusterConfig, get_config
from ..runtime.payload import Payload, PayloadError
from ..runtime.protocol import KEY_BYTES, KEY_FILE
from .backend import Backend, get_backend
from .grouping import default_name
from .model import (
    TENSORBOARD_ENV,
    JobSpec,
    JobState,
    SpecError,
    tensorboard_dir_for,
)
from .owner import current_user
from .provenance import SCRIPT_FILE, provenance, script_text
from .reaper import Reaper
from .record import JobRecord, new_job_id
from .results import JobResults, NoJSONForm
from .running.processes import this_host
from .starting import SupervisorStarter
from .stopping import STOP_SLACK, JobStillRunning, JobStopper
from .storage.store import JobStore, UnknownJob
from .tracking.params import PARAMS_FILE, params_file

if TYPE_CHECKING:
    from .forensics import StackReport

log = logging.getLogger("jupyterlab_mlcluster.service")

WAIT_POLL = 0.02


class DistributedJobFailed(RuntimeError):
    """A job ended `failed`; the message names the failing rank and shows its traceback.

    Printed under its own name (IPython's error message carries the class's __name__, and
    the rendered traceback says the same)."""

    def __init__(self, record: JobRecord, traceback_text: str | None):
        self.record = record
        self.traceback = traceback_text
        message = record.error or f"job {record.id} failed"
        if traceback_text:
            message += f"\n\nTraceback of rank {record.failed_rank}:\n{traceback_text.rstrip()}"
        super().__init__(message)

    def _render_traceback_(self) -> list[str]:
        """IPython shows this instead of our own (irrelevant) stack: the rank's story."""
        return [f"\x1b[31m{type(self).__name__}\x1b[0m: {self}"]


class DistributedJobCancelled(RuntimeError):
    """A job ended `cancelled` (the reason says who or what stopped it)."""

    def __init__(self, record: JobRecord):
        self.record = record
        super().__init__(f"job {record.id} was {record.reason or 'cancelled'}")

    def _render_traceback_(self) -> list[str]:
        return [f"\x1b[33m{type(self).__name__}\x1b[0m: {self}"]


# The names these had before (code that catches them keeps working; the class, and what is
# printed, is the Distributed* one).
JobFailed = DistributedJobFailed
JobCancelled = DistributedJobCancelled


def _with_tensorboard_dir(spec: JobSpec, setting: str, job_id: str) -> JobSpec:
    """The spec with its TensorBoard directory resolved for this job: `--tensorboard`, else
    the setting (unless the user's own --env names one), `{job}` replaced by the id."""
    template = spec.tensorboard
    if template is None and setting and TENSORBOARD_ENV not in spec.env:
        template = setting
    if template is None:
        return spec
    return dataclasses.replace(spec, tensorboard=tensorboard_dir_for(template, job_id))


class JobService:
    def __init__(self, config: MLClusterConfig | None = None, store: JobStore | None = None):
        self.config = config or get_config()
        self.store = store or JobStore(
            self.config.store_dir, journal_mode=self.config.store_journal_mode
        )
        self._backends: dict[str, Backend] = {}
        self.reaper = Reaper(self)
        self.results = JobResults(self.store, self.config)
        self.stopper = JobStopper(self.store, self.config, self.reap, self.wait)
        self.starter = SupervisorStarter(self.store, self.config, self.backend)

    def backend(self, name: str) -> Backend:
        if name not in self._backends:
            self._backends[name] = get_backend(name, self.config)
        return self._backends[name]

    # -- submit -------------------------------------------------------------------------

    def submit(
        self,
        spec: JobSpec,
        payload: Payload,
        *,
        origin: dict[str, Any] | None = None,
        attach_to_pid: int | None = None,
        environ: dict[str, str] | None = None,
        cwd: str | None = None,
        preload: list[str] | None = None,
        namespace: str | None = None,
        grace: float | None = None,
    ) -> JobRecord:
        """Store the job and start its supervisor. SpecError/PayloadError: nothing stored.

        `attach_to_pid`: cancel the job if that process dies (the foreground CLI).
        `environ`/`cwd`: what the ranks inherit (default: this process's).
        `preload`: modules the warm pool should learn (jobs/warm/preload.py chose them).
        `namespace`: where the job's objects go, for a backend with namespaces (a server that
        maps each user to their own namespace passes the caller's; never a user's option).
        None: the backend's configured one.
        `grace`: seconds between SIGTERM and SIGKILL when the job is stopped (--grace);
        None: MLClusterConfig.kill_grace_period."""
        # A JobSpec built in Python skipped from_options: check it before anything is written.
        spec.validate()
        backend = self.backend(spec.backend)
        if namespace is not None:
            backend = backend.in_namespace(namespace)
        if grace is not None and not backend.honours_grace:
            raise SpecError(
                f"--grace applies to local ranks; the {backend.name} backend's ranks get "
                "their platform's own termination grace period"
            )
        if (spec.stall_after or spec.on_stall != "warn") and not backend.watches_stalls:
            raise SpecError(
                "--stall-after and --on-stall apply to local and Slurm jobs for now; the"
                f" {backend.name} backend does not watch its ranks for stalls yet"
            )
        backend.validate(spec)
        try:
            payload.source.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise SpecError(
                f"the code cannot be encoded as UTF-8: {exc.reason} at position {exc.start}"
            ) from None
        job_id = new_job_id()
        spec = _with_tensorboard_dir(spec, self.config.tensorboard_dir, job_id)
        data, files = self.job_files(
            job_id,
            payload,
            environ,
            cwd,
            inherit_environment=backend.ranks_inherit_environment,
            grace=grace,
            fleet=backend.fleet_key(origin or {}) if self.config.supervise_together else None,
        )
        backend_state = backend.prepare(spec)
        origin = dict(origin or {})
        origin.setdefault("kind", "python")
        if attach_to_pid:
            import psutil

            origin["attach_pid"] = attach_to_pid
            origin["attach_create_time"] = psutil.Process(attach_to_pid).create_time()
            origin["attach_host"] = this_host()
        record = JobRecord(
            id=job_id,
            name=spec.name or _default_name(payload, origin),
            spec=spec,
            state=JobState.QUEUED,
            created=time.time(),
            owner=origin.get("user") or _current_user(),
            origin=origin,
            capacity=backend.capacity(),
            backend_state=backend_state,
        )
        # Row and files together or not at all (a full disk leaves nothing behind).
        self.store.insert_job(record, data, files)
        try:
            # What the ranks' environment will be (their inherited one, then --env): the warm
            # pool serves the job from a generation that imported with the same values. Only
            # where the ranks are this machine's processes: a cluster's pods get the job's
            # variables themselves, and a generation keyed by them would start a process here
            # with a variable the user chose (LD_PRELOAD on a shared server: its code as the
            # server). Such a job's supervisor comes from a generation of the pool's own values.
            job_env = (
                {**(os.environ if environ is None else environ), **spec.env}
                if backend.ranks_inherit_environment
                else None
            )
            self.starter.start(job_id, preload or [], job_env, payload)
        except Exception as exc:
            # If even this cannot be written (a full disk), the reaper fails the unclaimed
            # job after CLAIM_GRACE.
            with contextlib.suppress(Exception):
                self.store.transition(
                    job_id, JobState.FAILED, error=f"could not start the job: {exc}"
                )
            raise
        return self.store.get_job(job_id)

    def job_files(
        self,
        job_id: str,
        payload: Payload,
        environ: dict[str, str] | None,
        cwd: str | None,
        *,
        inherit_environment: bool = True,
        grace: float | None = None,
        fleet: str | None = None,
    ) -> tuple[bytes, dict[str, bytes]]:
        """(the payload's bytes, the other files of the job's directory): its key, what its
        ranks inherit (launch.json; the environment only where `inherit_environment`: the
        backend's ranks inherit it), the cell's source (tracebacks show its lines).
        `grace`: the job's own kill grace (--grace), kept as its setting. `fleet`: the
        fleet that supervises it (jobs/running/fleet.py), None: a process of its own."""
        if payload.kind == "code":
            payload.filename = str(self.store.job_dir(job_id) / "cell.py")
        data = payload.dumps()
        files = {
            # The job's secret for its ranks' reports, beside the payload (runtime/protocol.py).
            KEY_FILE: secrets.token_bytes(KEY_BYTES),
            "launch.json": json.dumps(
                {
                    # Only for backends whose ranks inherit it (local, Slurm): a cluster's
                    # pods get what the spec names, and the submitter's environment (a shared
                    # server's credentials, say) is not worth a copy on disk.
                    "env": dict(os.environ if environ is None else environ)
                    if inherit_environment
                    else {},
                    "cwd": cwd or os.getcwd(),
                    # The submitter's settings govern its job (e.g. a server's
                    # c.MLClusterConfig from jupyter_server_config reaches the supervisor).
                    "config": {
                        **config_snapshot(self.config),
                        **({} if grace is None else {"kill_grace_period": grace}),
                    },
                    # The journal mode this process chose ("auto" resolved): the job's
                    # supervisor opens the store the same way, whatever it would judge.
                    "store_journal_mode": self.store.journal_mode,
                    "fleet": fleet,
                }
            ).encode(),
        }
        # What `mlcluster export` needs without unpickling the payload (a server never
        # does): what ran, what was pushed, and the environment it ran with, pinned.
        files["provenance.json"] = json.dumps(
            provenance(payload.kind, payload.filename, payload.push)
        ).encode()
        if payload.kind == "script":
            text = script_text(payload.filename, cwd)
            if text is not None:
                files[SCRIPT_FILE] = text
        # An experiment's parameters (--track): the options and these pushed scalars.
        files[PARAMS_FILE] = params_file(payload.push)
        if payload.kind == "code":
            # Numbered as the rank runs it (from Payload.first_line), so what reads the file
            # by a frame's line (a stack's reader, jobs/forensics/) finds that line.
            padding = "\n" * max(0, payload.first_line - 1)
            files["cell.py"] = (padding + payload.source).encode("utf-8")
        return data, files

    # -- read ---------------------------------------------------------------------------

    def get(self, id_or_name: str, owner: str | None = None) -> JobRecord:
        """A job by id, or the newest with that name; `owner`: only among that user's jobs
        (another user's is UnknownJob, exactly as a missing one)."""
        self.reap()
        jobs = self.store.find_jobs(id_or_name)
        if owner is not None:
            jobs = [job for job in jobs if job.owner == owner]
        if not jobs:
            raise UnknownJob(id_or_name)
        return jobs[0]

    def list(self, **filters: Any) -> tuple[list[JobRecord], int]:
        self.reap()
        return self.store.list_jobs(**filters)

    def list_json(self, **filters: Any) -> tuple[builtins.list[str], int]:
        """`list`, each job as the JSON text of its record (what GET /jobs sends)."""
        self.reap()
        return self.store.list_json(**filters)

    def logs(
        self, job_id: str, rank: int | None = None, cursor: str | None = None, **kwargs: Any
    ) -> tuple[builtins.list[dict[str, Any]], str]:
        return self.store.read_logs(job_id, rank, cursor, **kwargs)

    def follow_logs(
        self, job_id: str, rank: int | None = None, cursor: str | None = None, poll: float = 0.1
    ) -> Iterator[dict[str, Any]]:
        """Yield log lines as they come, until the job is final and everything is read."""
        from .follow import JobFollower  # (asyncio and inotify: not for a command that only reads)

        follower = JobFollower(
            self.store, job_id, rank=rank, cursor=cursor, reap=self.reap, backstop=poll
        )
        for step in follower.steps():
            yield from step.lines

    def error_report(self, job_id: str) -> dict[str, Any] | None:
        record = self.store.get_job(job_id)
        if record.failed_rank is None:
            return None
        from ..runtime.errors import read_error_file  # ours, or a `@record` entry point's

        return read_error_file(
            self.store.error_path(job_id, record.failed_rank), record.failed_rank
        )

    def stacks(self, job_id: str, rank: int | None = None, native: bool = False) -> StackReport:
        """Where the job's ranks are (jobs/forensics/): a running job's read now by its
        backend, else the stacks it kept (the latest). NoSuchRank, NoStacks or
        StacksUnavailable (nothing changed) otherwise."""
        from .forensics import NoStacks, NoSuchRank, kept

        record = self.store.get_job(job_id)
        workers = record.spec.workers
        if rank is not None and not 0 <= rank < workers:
            raise NoSuchRank(
                f"job {record.id} has no rank {rank}: its ranks are 0 to {workers - 1}"
            )
        if record.state is JobState.RUNNING:
            ranks = None if rank is None else [rank]
            return self.backend(record.backend).collect_stacks(self.store, record, ranks, native)
        reports = kept(self.store.job_dir(record.id))
        if not reports:
            said = "its ranks have not started" if not record.final else "it kept no stacks"
            raise NoStacks(f"job {record.id} is {record.state}: {said}")
        return reports[-1] if rank is None else reports[-1].only(rank)

    def result(self, job_id: str) -> tuple[str, Any]:
        """See results.JobResults.unpickle: for the job owner's own process only."""
        return self.results.unpickle(job_id)

    def take_result(self, job_id: str) -> tuple[str, Any]:
        """See results.JobResults.hand_over: result(), then the result leaves the store."""
        return self.results.hand_over(job_id)

    def result_data(self, job_id: str) -> tuple[str, Any]:
        """See results.JobResults.as_data: what a server may read (never unpickled)."""
        return self.results.as_data(job_id)

    def result_json_file(self, job_id: str) -> BinaryIO | None:
        """See results.JobResults.json_file: the JSON form, open for a server to stream."""
        return self.results.json_file(job_id)

    def wait(self, job_id: str, timeout: float | None = None) -> JobRecord:
        """Block until the job is final (or `timeout` seconds pass); returns its record."""
        from .follow import JobFollower

        follower = JobFollower(self.store, job_id, logs=False, reap=self.reap, backstop=WAIT_POLL)
        return follower.until_final(timeout)

    def raise_for_state(self, record: JobRecord) -> None:
        if record.state == JobState.FAILED:
            report = self.error_report(record.id)
            raise DistributedJobFailed(record, report.get("traceback") if report else None)
        if record.state == JobState.CANCELLED:
            raise DistributedJobCancelled(record)

    def cluster(self, owner: str | None = None) -> dict[str, Any]:
        """Capacity, and the ids of queued and running jobs (`owner`: only that user's)."""
        backend_name = self.config.default_backend
        backend = self.backend(backend_name)
        capacity = backend.capacity()
        active, _ = self.store.list_jobs(states=["starting", "running"], backend=backend_name)
        used_cpus = sum((j.allocation or {}).get("cpus", 0) for j in active)
        used_memory = sum((j.allocation or {}).get("memory", 0) for j in active)
        used_gpus = {g for j in active for gs in (j.allocation or {}).get("gpus", []) for g in gs}
        mine = None
        if owner is not None:
            queued, _ = self.store.list_jobs(states=["queued"], backend=backend_name, owner=owner)
            mine = {j.id for j in queued}
        gpus = capacity.get("gpus", [])
        view = {
            "backend": backend_name,
            "capacity": {
                "gpus": {"total": len(gpus), "free": len([g for g in gpus if g not in used_gpus])},
                "cpus": {
                    "total": capacity.get("cpus"),
                    "free": max(0.0, capacity.get("cpus", 0) - used_cpus),
                },
                "memory": {
                    "total": capacity.get("memory"),
                    "free": max(0, capacity.get("memory", 0) - used_memory),
                },
            },
            "queue": [j for j in self.store.queue(backend_name) if mine is None or j in mine],
            "running": [j.id for j in active if owner is None or j.owner == owner],
        }
        # A cluster that says itself what is free (Slurm's sinfo) over the store's sums.
        view.update(backend.cluster_capacity() or {})
        return view

    # -- cancel / forget -------------------------------------------------------------------

    def cancel(
        self, job_id: str, *, purge: bool = False, wait: bool = True, by: str | None = None
    ) -> JobRecord | None:
        """Stop a job (all ranks); with `purge`, also forget it (stopping.JobStopper.cancel)."""
        return self.stopper.cancel(job_id, purge=purge, wait=wait, by=by)

    def job_grace(self, job_id: str) -> float:
        """The seconds the job's ranks get between SIGTERM and SIGKILL (stopping.py)."""
        return self.stopper.job_grace(job_id)

    def still_running(self, record: JobRecord) -> str | None:
        """What of the job may still run (None: nothing; stopping.py)."""
        return self.stopper.still_running(record)

    def _signal_supervisor(self, record: JobRecord, signum: int) -> None:
        self.stopper.signal_supervisor(record, signum)

    def reap(self, force: bool = False) -> builtins.list[str]:  # (`list` is a method here)
        """Settle jobs whose supervisor died (jobs/reaper.py); the ids it settled."""
        return self.reaper.reap(force)


def config_snapshot(config: MLClusterConfig) -> dict[str, Any]:
    return {name: getattr(config, name) for name in config.trait_names(config=True)}


def _current_user() -> str:
    return current_user()


def _default_name(payload: Payload, origin: dict[str, Any]) -> str:
    return default_name(payload.kind, origin, filename=payload.filename, function=payload.function)


__all__ = [
    "STOP_SLACK",
    "DistributedJobCancelled",
    "DistributedJobFailed",
    "JobCancelled",
    "JobFailed",
    "JobService",
    "JobStillRunning",
    "NoJSONForm",
    "PayloadError",
    "SpecError",
    "UnknownJob",
]
