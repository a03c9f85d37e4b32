"""Where a job's ranks run: `local/` (this machine), `kubernetes/` (a cluster), `slurm/`.

Importing this package registers each backend by name in `jobs/backend.py`'s registry, which
is how jobs/ finds them without importing them. Each factory imports its backend's module
when first asked, so a program pays only for the backends its jobs use. The front ends (the
CLI, the kernel's magics, the server extension, the `submit()` API) and a supervisor's program
entry import this package.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..jobs.backend import Backend, register_backend

if TYPE_CHECKING:
    from ..config import MLClusterConfig


def _local(config: MLClusterConfig) -> Backend:
    from .local.backend import LocalBackend

    return LocalBackend(config)


def _kubernetes(config: MLClusterConfig) -> Backend:
    from .kubernetes.backend import KubernetesBackend

    return KubernetesBackend(config)


def _slurm(config: MLClusterConfig) -> Backend:
    from .slurm.backend import SlurmBackend

    return SlurmBackend(config)


register_backend("local", _local)
register_backend("kubernetes", _kubernetes)
register_backend("slurm", _slurm)
