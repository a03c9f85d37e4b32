"""jupyterlab-mlcluster: distributed training a cell away.

    %load_ext jupyterlab_mlcluster          # (new kernels load it by themselves)
    %%distributed --workers 4
    ...

    import jupyterlab_mlcluster as mlc
    job = mlc.submit(train, workers=4)      # same engine from Python
    job.wait().result

Importing this package is cheap on purpose: ranks import it for `progress()` and `log()`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ._version import __version__
from .runtime.reporting import progress
from .runtime.scalars import log

if TYPE_CHECKING:
    from .jobs.handle import Job

__all__ = ["__version__", "progress", "log", "submit", "get_job", "Job", "load_ipython_extension"]


def submit(
    code_or_callable: str | Callable[..., Any],
    workers: int = 1,
    *,
    args: tuple[Any, ...] = (),
    kwargs: dict[str, Any] | None = None,
    push: dict[str, Any] | None = None,
    pull: list[str] | None = None,
    **options: Any,
) -> Job:
    """Run Python source (on every rank, as __main__) or a function (on every rank, with
    `args`/`kwargs`) as a distributed job; returns a Job handle at once.

    `options` are the %%distributed options in snake_case: gpus_per_worker, cpus, memory,
    framework, backend, image, name, env (dict), timeout, max_restarts, queue, priority.
    `push` maps names to values made available to the code; `pull` names variables of
    rank 0 to bring back as `job.result` (code only).
    """
    from .jobs.handle import Job
    from .jobs.model import JobSpec
    from .runtime.payload import Payload

    service = _service()
    spec = JobSpec.from_options(
        {"workers": workers, **options}, default_backend=service.config.default_backend
    )
    if callable(code_or_callable):
        if pull:
            raise ValueError(
                "pull applies to code, not to a function: return what you need instead"
            )
        payload = Payload(
            kind="callable", function=code_or_callable, args=tuple(args), kwargs=dict(kwargs or {})
        )
    elif isinstance(code_or_callable, str):
        payload = Payload(
            kind="code", source=code_or_callable, push=dict(push or {}), pull=list(pull or [])
        )
    else:
        raise TypeError(
            f"submit() takes Python source or a callable, got {type(code_or_callable).__name__}"
        )
    import os
    import sys

    payload.sys_path = [p for p in sys.path if p == "" or os.path.isdir(p)]
    record = service.submit(spec, payload, origin={"kind": "python"})
    return Job(service, record.id)


def get_job(id_or_name: str) -> Job:
    """A handle on an existing job (by id, or the newest job of that name)."""
    from .jobs.handle import Job

    service = _service()
    return Job(service, service.get(id_or_name).id)


_SERVICE = None


def _service():
    global _SERVICE
    if _SERVICE is None:
        from . import backends  # noqa: F401 - a front end fills the backend registry
        from .jobs.service import JobService

        _SERVICE = JobService()
    return _SERVICE


def load_ipython_extension(ipython) -> None:
    from .kernel.magics import load_ipython_extension as load

    load(ipython)


def unload_ipython_extension(ipython) -> None:
    from .kernel.magics import unload_ipython_extension as unload

    unload(ipython)


def _jupyter_server_extension_points() -> list[dict[str, Any]]:
    """The Jupyter server extension (REST API, event stream); enabled by jupyter-config/."""
    from .server.app import MLClusterApp

    return [{"module": "jupyterlab_mlcluster.server.app", "app": MLClusterApp}]


def __getattr__(name: str):
    if name == "Job":
        from .jobs.handle import Job

        return Job
    if name == "TrainerCallback":  # imports transformers: only when asked for
        from .runtime.hf import TrainerCallback

        return TrainerCallback
    if name == "LightningLogger":  # imports lightning: only when asked for
        from .runtime.lightning_logger import LightningLogger

        return LightningLogger
    raise AttributeError(name)


def _jupyter_labextension_paths() -> list[dict[str, str]]:
    """Where `jupyter labextension develop .` finds the built sidebar (a source checkout).

    Installed wheels ship it under share/jupyter/labextensions instead (pyproject
    shared-data), so this is only used for development installs.
    """
    return [{"src": "../labextension", "dest": "jupyterlab-mlcluster"}]
