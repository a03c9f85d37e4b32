"""Starting a job's supervisor: its fleet's (running/fleet.py), else a process of its own,
forked from the warm pool or started cold. A JobService starts one for each job it stores;
its reaper starts one again for a job that lives on after its supervisor died."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..config import MLClusterConfig
from ..runtime.payload import Payload
from .running.fleet import ensure_fleet
from .running.processes import start_detached
from .running.supervisor import launch_settings
from .storage.store import JobStore

if TYPE_CHECKING:
    from .backend import Backend


class SupervisorStarter:
    """Starts the supervisors of one store's jobs (`backend(name)`: the service's backends)."""

    def __init__(self, store: JobStore, config: MLClusterConfig, backend: Callable[[str], Backend]):
        self.store = store
        self.config = config
        self.backend = backend

    def _env(self) -> dict[str, str]:
        return dict(os.environ, MLCLUSTER_STORE_DIR=str(self.store.root))

    def start(
        self,
        job_id: str,
        preload: list[str] | tuple[str, ...] = (),
        job_env: dict[str, str] | None = None,
        payload: Payload | None = None,
    ) -> None:
        if self.hand_to_fleet(job_id):
            return
        if self.config.warm_pool:
            from . import warm
            from .warm import preload as preloads

            # What the job's code imports: it waits for a generation being built only if
            # that build has some of them the ready generations lack.
            needs = (
                preloads.payload_imports(payload.kind, payload.source, payload.filename)
                if payload is not None
                else None
            )
            if warm.spawn_supervisor(
                self.config, str(self.store.root), job_id, preload, job_env, needs
            ):
                return
        start_detached(
            [
                sys.executable,
                "-m",
                "jupyterlab_mlcluster.jobs.running.supervisor",
                str(self.store.root),
                job_id,
            ],
            open(self.store.job_dir(job_id) / "supervisor.log", "ab"),
            env=self._env(),
            reaper_name=f"mlcluster-reap-{job_id}",
        )

    def hand_to_fleet(self, job_id: str) -> bool:
        """A job its fleet supervises (launch.json's "fleet"): its fleet is started unless it
        runs; a live fleet sees the stored job itself. False where this process would start
        another fleet than the job's (another environment: a per-job supervisor, as before)."""
        key = launch_settings(self.store.root, job_id).get("fleet")
        if not key:
            return False
        backend = self.store.get_job(job_id).backend
        if self.backend(backend).fleet_key({}) != key:
            return False
        ensure_fleet(self.store, backend, key, self._env())
        return True
