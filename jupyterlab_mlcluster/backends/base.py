"""The one small interface every backend implements.

A backend is used in two places:
- in the submitting process: `validate` (refuse the impossible before anything is stored),
  `capacity` (what admission and `GET /cluster` see);
- inside the job's supervisor process: `run(ctx)`, which drives the job to a final state
  through the JobContext (state, per-rank state, logs, metrics) and honours ctx.cancelled.
When a supervisor dies, `supervisor_lost` says what the reaper does about it.
"""

from __future__ import annotations

import abc
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..config import MLClusterConfig
    from ..jobs.model import JobSpec
    from ..jobs.record import JobRecord
    from ..jobs.store import JobStore
    from ..jobs.supervisor import JobContext


class Backend(abc.ABC):
    name: str = ""
    # Whether the job's ranks run with the submitter's environment (launch.json keeps a copy
    # for its supervisor). False where ranks run elsewhere with their own (a cluster's pods):
    # then no copy is kept, since a shared server's environment holds its own credentials.
    ranks_inherit_environment: bool = True
    # Whether a job's own SIGTERM-to-SIGKILL grace (--grace) is honoured; where it is not,
    # the option is refused rather than ignored.
    honours_grace: bool = False

    def __init__(self, config: "MLClusterConfig"):
        self.config = config

    @abc.abstractmethod
    def validate(self, spec: "JobSpec") -> None:
        """Raise SpecError if this backend could never run `spec`."""

    @abc.abstractmethod
    def capacity(self) -> dict[str, Any]:
        """Total resources as {"cpus": float, "gpus": [ids], "memory": bytes} (or what the
        backend can tell), stored with each job for admission."""

    def cluster_capacity(self) -> dict[str, Any] | None:
        """GET /cluster's view where the cluster itself says what is free (`capacity`, and
        more keys to add to the reply); None: computed from the store's allocations."""
        return None

    def in_namespace(self, namespace: str) -> "Backend":
        """This backend placing jobs in `namespace` (a server that maps each user to their own
        namespace passes the caller's); SpecError where the backend has no namespaces."""
        from ..jobs.model import SpecError

        raise SpecError(f"the {self.name} backend does not place jobs in namespaces")

    def prepare(self, spec: "JobSpec") -> dict[str, Any]:
        """Backend-private data fixed at submit time (e.g. namespace, image); stored."""
        return {}

    @abc.abstractmethod
    def run(self, ctx: "JobContext") -> None:
        """Drive the job to a final state. Runs in the job's supervisor process."""

    def supervisor_lost(self, store: "JobStore", job: "JobRecord") -> str:
        """'fail' (the job died with its supervisor) or 'respawn' (it lives on elsewhere,
        e.g. in a cluster, and a new supervisor can adopt it)."""
        return "fail"

    def cleanup_orphans(self, store: "JobStore", job: "JobRecord") -> None:
        """Stop whatever a dead supervisor may have left behind."""

    # Schedules (jobs/scheduler.py). Locally, schedulers in the store fire them; a backend
    # whose cluster fires them itself (a Kubernetes CronJob) registers them there.
    fires_schedules = False

    def register_schedule(self, row: dict[str, Any], payload: bytes) -> None:
        """Make the cluster fire this schedule (SpecError if it cannot)."""

    def suspend_schedule(self, name: str, suspended: bool) -> None:
        """Pause or resume the cluster's schedule."""

    def forget_schedule(self, name: str) -> None:
        """Delete the cluster's schedule (absent already is fine)."""


def get_backend(name: str, config: "MLClusterConfig") -> Backend:
    if name == "local":
        from .local.backend import LocalBackend

        return LocalBackend(config)
    if name == "kubernetes":
        from .kubernetes.backend import KubernetesBackend

        return KubernetesBackend(config)
    if name == "slurm":
        from .slurm.backend import SlurmBackend

        return SlurmBackend(config)
    raise ValueError(f"unknown backend {name!r}")
