"""The server's share of firing schedules: a periodic pass of jobs/experiments/scheduler.py's
`Scheduler` in the extension's executor (the REST handlers of schedules are
handlers/experiments.py)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING

from ..jobs.experiments.scheduler import Scheduler, pass_backoff

if TYPE_CHECKING:
    from .app import MLClusterApp

log = logging.getLogger("jupyterlab_mlcluster.server")


class ServerScheduler:
    """This server's share of firing schedules: one pass every `interval` seconds, its
    blocking work in the extension's executor (never on tornado's loop), one pass at a time;
    a failing pass is logged and the next waits longer (jitter, capped)."""

    MAX_BACKOFF = 300.0

    def __init__(self, app: MLClusterApp, interval: float):
        self.app = app
        self.interval = interval
        self.scheduler = Scheduler(app.service, shared=app.trust_identity_header)
        self._task: asyncio.Task | None = None
        self.passes = 0

    def start(self) -> None:
        if self.interval > 0 and self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._loop())

    async def _loop(self) -> None:
        failures = 0
        while True:
            try:
                fired = await self.app.run(self.scheduler.fire_due)
                self.passes += 1
                for item in fired:
                    log.info("mlcluster: schedule %s", item)
                failures = 0
                wait = self.interval
            except asyncio.CancelledError:
                raise
            except Exception:
                failures += 1
                log.exception("mlcluster: scheduler pass failed (%d in a row)", failures)
                wait = pass_backoff(self.interval, self.MAX_BACKOFF, 8).delay(failures)
            await asyncio.sleep(wait)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
