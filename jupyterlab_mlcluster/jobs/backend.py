"""The one small interface every backend implements, and the registry that finds them.

The interface lives here, in jobs/, because jobs/ calls it (the service, the supervisor, the
reaper) while the backends (backends/) implement it: jobs/ never imports a backend. The front
ends fill the registry by importing `jupyterlab_mlcluster.backends`, which registers each
backend under its name (a factory that imports the backend's module only when first asked,
so a front end pays for no backend it does not use); so do the program entries of a cold
supervisor (`python -m jupyterlab_mlcluster.jobs.running.supervisor`) and of the warm pool's zygote.

A backend is used in two places:
- in the submitting process: `validate` (refuse the impossible before anything is stored),
  `capacity` (what admission and `GET /cluster` see);
- inside the job's supervisor process: `run(ctx)`, which drives the job to a final state
  through the JobContext (state, per-rank state, logs, metrics) and honours ctx.cancelled.
When a supervisor dies, `supervisor_lost` says what the reaper does about it.
"""

from __future__ import annotations

import abc
import enum
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..config import MLClusterConfig
    from .forensics import StackReport
    from .model import JobSpec
    from .record import JobRecord
    from .running.supervisor import JobContext
    from .storage.store import JobStore


class SupervisorLost(enum.StrEnum):
    """What the reaper does with a job whose supervisor died (Backend.supervisor_lost)."""

    FAIL = "fail"  # the job died with its supervisor: settle it
    RESPAWN = "respawn"  # it lives on elsewhere (a cluster): a new supervisor adopts it


class Backend(abc.ABC):
    name: str = ""
    # Whether the job's ranks run with the submitter's environment (launch.json keeps a copy
    # for its supervisor). False where ranks run elsewhere with their own (a cluster's pods):
    # then no copy is kept, since a shared server's environment holds its own credentials.
    ranks_inherit_environment: bool = True
    # Whether a job's own SIGTERM-to-SIGKILL grace (--grace) is honoured; where it is not,
    # the option is refused rather than ignored.
    honours_grace: bool = False
    # Whether its supervisor watches the ranks for stalls (--stall-after, --on-stall:
    # jobs/forensics/stall.py); where it does not, asking for it is refused, not ignored.
    watches_stalls: bool = False

    def __init__(self, config: MLClusterConfig):
        self.config = config

    @abc.abstractmethod
    def validate(self, spec: JobSpec) -> None:
        """Raise SpecError if this backend could never run `spec`."""

    @abc.abstractmethod
    def capacity(self) -> dict[str, Any]:
        """Total resources as {"cpus": float, "gpus": [ids], "memory": bytes} (or what the
        backend can tell), stored with each job for admission."""

    def cluster_capacity(self) -> dict[str, Any] | None:
        """GET /cluster's view where the cluster itself says what is free (`capacity`, and
        more keys to add to the reply); None: computed from the store's allocations."""
        return None

    def in_namespace(self, namespace: str) -> Backend:
        """This backend placing jobs in `namespace` (a server that maps each user to their own
        namespace passes the caller's); SpecError where the backend has no namespaces."""
        from .model import SpecError

        raise SpecError(f"the {self.name} backend does not place jobs in namespaces")

    def prepare(self, spec: JobSpec) -> dict[str, Any]:
        """Backend-private data fixed at submit time (e.g. namespace, image); stored."""
        return {}

    @abc.abstractmethod
    def run(self, ctx: JobContext) -> None:
        """Drive the job to a final state. Runs in the job's supervisor process."""

    def fleet_key(self, origin: dict[str, Any]) -> str | None:
        """The fleet that supervises a job of this `origin` (jobs/running/fleet.py: one
        process for many jobs), named by what decides where its jobs run; None: a
        supervisor process of its own."""
        return None

    def supervisor_lost(self, store: JobStore, job: JobRecord) -> SupervisorLost:
        """FAIL (the job died with its supervisor) or RESPAWN (it lives on elsewhere,
        e.g. in a cluster, and a new supervisor can adopt it)."""
        return SupervisorLost.FAIL

    def cleanup_orphans(self, store: JobStore, job: JobRecord) -> None:
        """Stop whatever a dead supervisor may have left behind."""

    def collect_stacks(
        self, store: JobStore, job: JobRecord, ranks: list[int] | None, native: bool
    ) -> StackReport:
        """Every thread's stack of the running job's ranks (`ranks`: only these), read now
        (jobs/forensics/); a rank that cannot be read is in the report's `missing`, with
        why. Runs in the asking process (CLI, kernel, server). StacksUnavailable where this
        backend cannot read its ranks (nothing is changed then)."""
        from .forensics import StacksUnavailable

        raise StacksUnavailable(f"the {self.name} backend cannot read its ranks' stacks yet")

    # Schedules (jobs/experiments/scheduler.py). Locally, schedulers in the store fire them;
    # a backend whose cluster fires them itself (a Kubernetes CronJob) registers them there.
    fires_schedules = False

    def register_schedule(self, row: dict[str, Any], payload: bytes) -> None:
        """Make the cluster fire this schedule (SpecError if it cannot)."""

    def suspend_schedule(self, name: str, suspended: bool) -> None:
        """Pause or resume the cluster's schedule."""

    def forget_schedule(self, name: str) -> None:
        """Delete the cluster's schedule (absent already is fine)."""


# name -> factory(config) -> Backend; filled by `jupyterlab_mlcluster.backends` on import.
_REGISTRY: dict[str, Callable[[MLClusterConfig], Backend]] = {}


def register_backend(name: str, factory: Callable[[MLClusterConfig], Backend]) -> None:
    """Make `get_backend(name, config)` return `factory(config)`."""
    _REGISTRY[name] = factory


def get_backend(name: str, config: MLClusterConfig) -> Backend:
    factory = _REGISTRY.get(name)
    if factory is None:
        if not _REGISTRY:  # a program that never imported the backends package
            raise ValueError(
                f"unknown backend {name!r}: no backend is registered "
                "(import jupyterlab_mlcluster.backends first)"
            )
        raise ValueError(f"unknown backend {name!r}")
    return factory(config)
