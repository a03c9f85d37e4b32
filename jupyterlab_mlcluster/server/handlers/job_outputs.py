"""REST handlers of what a job gives back: `/jobs/{id}/logs` (a page, or followed as
newline-delimited JSON), `/metrics`, `/stacks` (where its ranks are), `/result` (its JSON
form only, streamed) and `/tensorboard` (open a TensorBoard on one or more jobs' event files).
"""

from __future__ import annotations

import asyncio
import json
from json.encoder import encode_basestring_ascii
from typing import Any

from jupyter_server.auth.decorator import authorized
from tornado import web
from tornado.iostream import StreamClosedError

from ...jobs.follow import JobFollower, Step
from ...jobs.model import JobState, tensorboard_dir_for
from ...jobs.service import NoJSONForm
from ...jobs.storage.series import read_series
from ...jobs.storage.store import UnknownJob
from ..tensorboard import ENV_NAME as TENSORBOARD_ENV
from ..tensorboard import (
    NoTensorBoardData,
    PlaceRefused,
    TensorBoardFailed,
    has_event_files,
    tensorboard_installed,
    tensorboard_location,
)
from .base import MLClusterHandler

FOLLOW_READ_BYTES = 64 * 1024
PAGE_READ_BYTES = 1024 * 1024


class LogsHandler(MLClusterHandler):
    api_path = "/jobs/{id}/logs"
    _closed = False
    _changed: asyncio.Event | None = None

    @web.authenticated
    @authorized("read")
    async def get(self, ref: str) -> None:
        q = self.query()
        record = await self.job(ref)
        rank = q.get("rank")
        if rank is not None and rank >= record.spec.workers:
            # A well-formed rank this job does not have: missing, as a path would be (the
            # document's 404), not a malformed request.
            raise web.HTTPError(
                404,
                f"job {record.id} has no rank {rank}: its ranks are 0 to {record.spec.workers - 1}",
            )
        if q["follow"]:
            await self._follow(record.id, rank, q.get("since"), q.get("tail"))
            return

        def page() -> dict[str, Any]:
            lines, cursor = self.app.service.logs(
                record.id, rank, q.get("since"), max_bytes=PAGE_READ_BYTES, tail=q.get("tail")
            )
            return {"lines": lines, "cursor": cursor}

        await self.send_encoded(page)

    async def _follow(
        self, job_id: str, rank: int | None, cursor: str | None, tail: int | None
    ) -> None:
        """Newline-delimited JSON lines as they come, until the job is final and all is sent.
        Woken by the store's change feed (the broadcaster's, no polling); waits for the
        client between writes."""
        self.set_header("Content-Type", "application/x-ndjson")
        self.set_header("Cache-Control", "no-cache")
        self.set_header("X-Accel-Buffering", "no")  # let reverse proxies stream it
        with self.app.broadcaster.job_changed(job_id) as changed:
            self._changed = changed
            follower = JobFollower(
                self.app.service.store,
                job_id,
                rank=rank,
                cursor=cursor,
                tail=tail,
                max_bytes=FOLLOW_READ_BYTES,
                wake=changed,
            )

            def step_encoded() -> Step:
                step = follower.step()
                if step.lines:
                    # Where to resume after this batch, should the stream break: a client
                    # reconnects with `since=<cursor>` instead of reloading everything.
                    step.lines[-1] = {**step.lines[-1], "cursor": step.cursor}
                    step.data = ndjson(step.lines)
                return step

            try:
                async for step in follower.steps_async(run=lambda _: self.run(step_encoded)):
                    if self._closed:
                        break
                    if step.data:
                        self.write(step.data)
                        await self.flush()
            except UnknownJob:
                pass  # purged while we followed it
            except StreamClosedError:
                return
        if not self._closed:
            self.finish(set_content_type="application/x-ndjson")

    def on_connection_close(self) -> None:
        self._closed = True
        if self._changed is not None:
            self._changed.set()  # stop waiting for a job that may not change for hours
        super().on_connection_close()


class MetricsHandler(MLClusterHandler):
    api_path = "/jobs/{id}/metrics"

    @web.authenticated
    @authorized("read")
    async def get(self, ref: str) -> None:
        query = self.query()
        since = query.get("since")
        wanted = query["series"].split(",") if query.get("series") else []
        record = await self.job(ref)

        def metrics() -> dict[str, Any]:
            store = self.app.service.store
            history = store.metrics_history(record.id, since)
            logged = read_series(store.job_dir(record.id), wanted, query.get("after") or 0)
            ranks = []
            for rank in record.to_json()["ranks"]:
                ranks.append(
                    {
                        "rank": rank["rank"],
                        "current": rank["metrics"],
                        "series": history.get(rank["rank"], []),
                    }
                )
            return {"id": record.id, "ranks": ranks, "logged": logged}

        await self.send_encoded(metrics)


class StacksHandler(MLClusterHandler):
    api_path = "/jobs/{id}/stacks"

    @web.authenticated
    @authorized("read")
    async def get(self, ref: str) -> None:
        from ...jobs import forensics

        q = self.query()
        record = await self.job(ref)

        def stacks() -> dict[str, Any]:
            return self.app.service.stacks(record.id, q.get("rank"), q["native"]).to_json()

        try:
            await self.send_encoded(stacks)
        except forensics.NoSuchRank as exc:
            raise web.HTTPError(404, str(exc)) from None
        except forensics.NoStacks as exc:
            raise web.HTTPError(409, str(exc)) from None
        except forensics.StacksUnavailable as exc:
            raise web.HTTPError(501, str(exc)) from None


class TensorBoardHandler(MLClusterHandler):
    api_path = "/jobs/{id}/tensorboard"

    @web.authenticated
    @authorized("read")
    async def post(self, ref: str) -> None:
        body = self.json_body() if self.body.strip() else {}
        records = [await self.job(ref)]
        for other in body.get("jobs", []):
            record = await self.job(other)
            if all(r.id != record.id for r in records):
                records.append(record)
        store = self.app.service.store

        places = self.app.tensorboard_places
        default = self.app.mlconfig.tensorboard_dir

        def locations() -> dict[str, str]:
            runs = {}
            for record in records:
                location = tensorboard_location(store, record)
                if places is not None:  # checked again: the job may come from elsewhere
                    location = places.check(
                        location,
                        record.owner or "",
                        own_dir=str(store.tensorboard_dir(record.id)),
                        default=tensorboard_dir_for(default, record.id) if default else "",
                    )
                if not has_event_files(location):
                    raise NoTensorBoardData(
                        f"job {record.id} ({record.name}) has written no TensorBoard data yet "
                        f"to {location} (its ranks find the directory in ${TENSORBOARD_ENV})"
                    )
                runs[record.id] = location
            return runs

        try:
            runs = await self.run(locations)
        except NoTensorBoardData as exc:
            raise web.HTTPError(409, str(exc)) from None
        except PlaceRefused as exc:
            # One already running on it (opened before a link appeared) goes too.
            await self.app.tensorboards.stop_showing(r.id for r in records)
            raise web.HTTPError(403, str(exc)) from None
        if not await self.run(tensorboard_installed):
            raise web.HTTPError(
                503,
                "TensorBoard is not installed in the server's environment "
                "(pip install tensorboard)",
            )
        try:
            url = await self.app.tensorboards.open(runs, owner=self.scope())
        except TensorBoardFailed as exc:
            raise web.HTTPError(503, str(exc)) from None
        self.send({"url": url, "jobs": sorted(runs)})


class ResultHandler(MLClusterHandler):
    api_path = "/jobs/{id}/result"

    @web.authenticated
    @authorized("read")
    async def get(self, ref: str) -> None:
        record = await self.job(ref)
        if record.state != JobState.SUCCEEDED:
            raise web.HTTPError(
                409, f"job {record.id} is {record.state.value}: only a succeeded job has a result"
            )

        # Data only: the JSON form the rank wrote, as stored, streamed without decoding it
        # (a shared server must not hold several copies of everyone's results). Unpickling
        # here would run whatever the job's author put in the pickle, as this server.
        try:
            stored = await self.run(self.app.service.result_json_file, record.id)
        except NoJSONForm as exc:
            raise web.HTTPError(
                409,
                f"the result of job {record.id} has no JSON form ({exc}); get it in "
                f"Python: jupyterlab_mlcluster.get_job({record.id!r}).result",
            ) from None
        self.set_header("Content-Type", "application/json")
        if stored is None:
            self.finish(json.dumps({"kind": "none", "value": None}))
            return
        try:
            while chunk := await self.run(stored.read, FOLLOW_READ_BYTES):
                self.write(chunk)
                await self.flush()
        except StreamClosedError:
            return
        finally:
            stored.close()
        self.finish()


def ndjson(lines: list[dict[str, Any]]) -> bytes:
    """Log lines as newline-delimited JSON, the same objects json.dumps would give, about
    five times faster (a flat-out job prints ~100k lines/s; this runs while it does)."""
    return "".join(
        '{"rank": %d, "ts": "%s", "stream": "%s", "line": %s}\n'  # noqa: UP031 - fastest here
        % (line["rank"], line["ts"], line["stream"], encode_basestring_ascii(line["line"]))
        for line in lines
    ).encode()
