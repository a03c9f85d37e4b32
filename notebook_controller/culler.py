"""Culling: every `cull_check_period`, each ready Notebook's server is asked for its
activity (culling.probe_activity); one idle for longer than `cull_idle_time` is stopped (the
stop annotation, guarded by the probed object's resourceVersion) with an Event saying why,
and the last activity seen is kept in its status.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
from collections.abc import Callable, Mapping
from typing import Any

import aiohttp

from . import objects
from .config import ControllerConfig
from .crd import API_VERSION, KIND
from .culling import ProbeError, probe_activity, should_cull
from .events import notebook_event
from .kube import KubeClient, KubeError
from .metrics import CULLED

log = logging.getLogger("notebook_controller")


class Culler:
    """Stops the Notebooks idle for too long, among `live_notebooks()`."""

    def __init__(
        self,
        config: ControllerConfig,
        kube: KubeClient,
        http: aiohttp.ClientSession,
        live_notebooks: Callable[[], list[dict[str, Any]]],
    ) -> None:
        self.config = config
        self.kube = kube
        self.http = http
        self.live_notebooks = live_notebooks

    def cullable(self, notebook: Mapping[str, Any]) -> bool:
        return not objects.is_stopped(notebook) and bool(
            (notebook.get("status") or {}).get("ready")
        )

    async def cull_all(self) -> None:
        limit = asyncio.Semaphore(16)

        async def check(notebook: dict[str, Any]) -> None:
            async with limit:
                await self.check_activity(notebook)

        await asyncio.gather(*(check(nb) for nb in self.live_notebooks() if self.cullable(nb)))

    async def check_activity(self, notebook: dict[str, Any]) -> None:
        """Record the notebook's last activity; stop it once idle longer than allowed."""
        namespace, name = notebook["metadata"]["namespace"], notebook["metadata"]["name"]
        url = self.config.notebook_url_template.format(name=name, namespace=namespace)
        try:
            activity = await probe_activity(self.http, url, self.config.probe_timeout)
        except ProbeError as exc:
            log.debug("Activity of %s/%s unknown, not culling: %s", namespace, name, exc)
            return
        now = datetime.datetime.now(datetime.UTC)
        last = objects.rfc3339(activity.last_activity)
        try:
            if should_cull(activity, now, self.config.cull_idle_time, self.config.cull_connected):
                idle = int((now - activity.last_activity).total_seconds())
                # Only the notebook that was probed, unchanged since: not a new one of that name.
                await self.kube.patch(
                    API_VERSION,
                    KIND,
                    namespace,
                    name,
                    objects.guarded_stop_patch(notebook, True, now),
                )
                await self.kube.create(
                    notebook_event(
                        notebook,
                        "Culled",
                        f"Stopped after {idle} s without activity (last: {last})",
                        now,
                    )
                )
                CULLED.inc()
                log.info("Culled %s/%s after %d s idle", namespace, name, idle)
            elif (notebook.get("status") or {}).get("lastActivity") != last:
                await self.kube.patch(
                    API_VERSION,
                    KIND,
                    namespace,
                    name,
                    {"status": {"lastActivity": last}},
                    subresource="status",
                )
        except KubeError as exc:
            log.warning("Could not record activity of %s/%s: %s", namespace, name, exc)
