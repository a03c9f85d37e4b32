"""REST handlers for sweeps and schedules (`/mlcluster/api/sweeps`, `/schedules`); the
server's share of firing schedules is server/scheduling.py.

Scoped like jobs: with a trusted identity header a caller sees and touches only its own
sweeps and schedules; another user's looks exactly like a missing one (404).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from jupyter_server.auth.decorator import authorized
from tornado import web

from ... import patterns
from ...jobs.experiments.scheduler import delete as delete_schedule
from ...jobs.experiments.scheduler import experiments, run_json, schedule_json
from ...jobs.experiments.scheduler import pause as pause_schedule
from ...jobs.experiments.store import UnknownSchedule, UnknownSweep
from ...jobs.experiments.sweep import Sweep
from .base import MLClusterHandler


class ExperimentHandler(MLClusterHandler):
    def _owned_row(
        self,
        what: str,
        key: str,
        pattern: Any,
        get: Callable[[str], dict[str, Any]],
        unknown: type[Exception],
    ) -> dict[str, Any]:
        """The row `get(key)` when the key is well formed, exists and the caller may see it;
        404 alike for all three, so that others' names are not revealed."""
        missing = web.HTTPError(404, f"no {what} {key!r}")
        if not patterns.matches(pattern, key):
            raise missing
        try:
            row = get(key)
        except unknown:
            raise missing from None
        scope = self.scope()
        if scope is not None and row["owner"] != scope:
            raise missing
        return row

    def _sweep_row(self, sweep_id: str) -> dict[str, Any]:
        def get(key: str) -> dict[str, Any]:
            return experiments(self.app.service).get_sweep(key)

        return self._owned_row("sweep", sweep_id, patterns.SWEEP_ID, get, UnknownSweep)

    def _schedule_row(self, name: str) -> dict[str, Any]:
        def get(key: str) -> dict[str, Any]:
            return experiments(self.app.service).get_schedule(key)

        return self._owned_row("schedule", name, patterns.SCHEDULE_NAME, get, UnknownSchedule)


class _ListingHandler(ExperimentHandler):
    """GET a collection: the caller's own rows (all of them without an identity header)."""

    collection: str

    def rows(self, store: Any, owner: str | None) -> list[dict[str, Any]]:
        raise NotImplementedError

    def item(self, service: Any, row: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError

    @web.authenticated
    @authorized("read")
    async def get(self) -> None:
        scope = self.scope()
        service = self.app.service

        def listing() -> dict[str, Any]:
            rows = self.rows(experiments(service), scope)
            return {self.collection: [self.item(service, r) for r in rows]}

        await self.send_encoded(listing)


class SweepsHandler(_ListingHandler):
    api_path = "/sweeps"
    collection = "sweeps"

    def rows(self, store: Any, owner: str | None) -> list[dict[str, Any]]:
        return store.list_sweeps(owner=owner)

    def item(self, service: Any, row: dict[str, Any]) -> dict[str, Any]:
        return Sweep(service, row["id"], service.result_data).to_json()


class SweepHandler(ExperimentHandler):
    api_path = "/sweeps/{id}"

    @web.authenticated
    @authorized("read")
    async def get(self, sweep_id: str) -> None:
        def one() -> dict[str, Any]:
            self._sweep_row(sweep_id)
            service = self.app.service
            return Sweep(service, sweep_id, service.result_data).to_json()

        await self.send_encoded(one)


class SchedulesHandler(_ListingHandler):
    api_path = "/schedules"
    collection = "schedules"

    def rows(self, store: Any, owner: str | None) -> list[dict[str, Any]]:
        return store.list_schedules(owner=owner)

    def item(self, service: Any, row: dict[str, Any]) -> dict[str, Any]:
        return schedule_json(service, row)


class ScheduleHandler(ExperimentHandler):
    api_path = "/schedules/{name}"

    @web.authenticated
    @authorized("read")
    async def get(self, name: str) -> None:
        await self.send_encoded(lambda: schedule_json(self.app.service, self._schedule_row(name)))

    @web.authenticated
    @authorized("write")
    async def delete(self, name: str) -> None:
        def delete() -> None:
            self._schedule_row(name)
            try:
                delete_schedule(self.app.service, name)
            except UnknownSchedule:  # deleted by someone else meanwhile
                raise web.HTTPError(404, f"no schedule {name!r}") from None

        await self.run(delete)
        self.set_status(204)
        self.finish()


class _SuspendHandler(ExperimentHandler):
    suspend = True

    @web.authenticated
    @authorized("write")
    async def post(self, name: str) -> None:
        def change() -> dict[str, Any]:
            self._schedule_row(name)
            store = experiments(self.app.service)
            try:
                pause_schedule(self.app.service, name, self.suspend)
            except UnknownSchedule:
                raise web.HTTPError(404, f"no schedule {name!r}") from None
            return schedule_json(self.app.service, store.get_schedule(name))

        await self.send_encoded(change)


class SchedulePauseHandler(_SuspendHandler):
    api_path = "/schedules/{name}/pause"
    suspend = True


class ScheduleResumeHandler(_SuspendHandler):
    api_path = "/schedules/{name}/resume"
    suspend = False


class ScheduleRunsHandler(ExperimentHandler):
    api_path = "/schedules/{name}/runs"

    @web.authenticated
    @authorized("read")
    async def get(self, name: str) -> None:
        def runs() -> dict[str, Any]:
            self._schedule_row(name)
            return {"runs": [run_json(r) for r in experiments(self.app.service).runs(name)]}

        await self.send_encoded(runs)
