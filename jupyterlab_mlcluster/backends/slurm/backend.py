"""The Slurm backend: a job is one sbatch allocation of N tasks, started in one srun step.

In the submitting process: `validate` asks Slurm itself (`sbatch --test-only`) so a job it
would refuse is refused, in its words, before anything is stored; `capacity` reads sinfo.
Inside the supervisor: each attempt of the job is an `Attempt` (attempt.py), which submits,
follows, streams and stops one allocation. The reaper cancels what a dead supervisor left,
found by the comment every allocation of ours carries (cleanup.py).

Its pure builders and parsers are script.py; its calls of sbatch, squeue, scancel and sinfo
are commands.py.
"""

from __future__ import annotations

import logging
import tempfile
import time
from typing import TYPE_CHECKING, Any

from ...jobs import lifecycle
from ...jobs.backend import Backend
from ...jobs.lifecycle import Outcome
from ...jobs.model import JobSpec, SpecError
from ...jobs.sessions import is_session_holder
from . import forensics, script
from .attempt import Attempt
from .cleanup import PendingCleanup, current_slurm_user
from .commands import SlurmCommands, SlurmError

if TYPE_CHECKING:
    from ...jobs.forensics import StackReport
    from ...jobs.record import JobRecord
    from ...jobs.running.supervisor import JobContext
    from ...jobs.storage.store import JobStore

log = logging.getLogger("jupyterlab_mlcluster.supervisor")

SINFO_TTL = 1.0
__all__ = ["SlurmBackend", "current_slurm_user"]  # (tests import the user from here)


class SlurmBackend(Backend):
    name = "slurm"
    # Cancel, a failing rank and a timeout are SIGTERM, then SIGKILL after the job's grace.
    honours_grace = True

    def commands(self) -> SlurmCommands:
        return SlurmCommands(self.config.slurm_bin_dir, self.config.slurm_command_timeout)

    watches_stalls = True

    def collect_stacks(
        self, store: JobStore, job: JobRecord, ranks: list[int] | None, native: bool
    ) -> StackReport:
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

    def cleanup_orphans(self, store: JobStore, job: JobRecord) -> None:
        """Cancel what the job's dead supervisor left on Slurm (cleanup.py)."""
        PendingCleanup(store, job.id).reap(self.commands(), self.config.slurm_poll_interval)

    # -- inside the supervisor -------------------------------------------------------------

    def run(self, ctx: JobContext) -> None:
        if is_session_holder(ctx.job):  # cells on an allocation that lives (session.py)
            from .session import serve_session

            serve_session(self, ctx)
            return
        launch = ctx.store.read_launch(ctx.job.id)
        attempts: list[Attempt] = []

        def attempt(number: int) -> Outcome:
            if attempts:  # a restart: the previous allocation is gone first
                attempts[-1].release()
            attempts.append(Attempt(self, ctx, launch, number))
            return attempts[-1].run()

        try:
            lifecycle.run_attempts(ctx, attempt)
        finally:
            # The job is final once its ranks are: the allocation's own end (Slurm's step
            # cleanup, epilog) is waited for after, off the job's critical path.
            if attempts:
                attempts[-1].release()
