"""The base of every REST handler of `/mlcluster/api` (see openapi.py for the document
they implement; app.py's `routes()` mounts them, a module of this package per resource).

Every method is `@web.authenticated` + `@authorized` (resource "mlcluster"); errors are
JSON `{"message": ...}`. Anything that touches SQLite, files, processes or Kubernetes runs
in the extension's executor (`self.run(...)`), never on the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import url_path_join
from tornado import web

from ... import patterns
from ...jobs.storage.store import UnknownJob
from ..identity import IdentityError
from ..openapi import API_PREFIX, RequestError

if TYPE_CHECKING:
    from ...jobs.record import JobRecord
    from ..app import MLClusterApp

T = TypeVar("T")
# The longest wait_for_job goes without looking at the job: a backstop for a change the
# broadcaster's feed does not announce (a writer on another host of a shared store).
WAIT_BACKSTOP = 1.0


def body_too_large(limit: int) -> str:
    return (
        f"the request body is larger than this server reads ({limit} bytes, "
        "MLClusterApp.max_request_body)"
    )


@web.stream_request_body  # the body's size is judged before any of it is read (prepare)
class MLClusterHandler(APIHandler):
    auth_resource = "mlcluster"
    # The OpenAPI path this handler serves (e.g. "/jobs/{id}"); set by each subclass.
    api_path = ""
    _body: bytearray | None = None

    # APIHandler.prepare drops JupyterHandler's keyword too (and says type: ignore[override]).
    async def prepare(self) -> None:  # type: ignore[override]
        """Refuse a body over MLClusterApp.max_request_body (413) from its Content-Length,
        before reading it (and after Jupyter's own checks: who may send one at all)."""
        await super().prepare()
        limit = self.app.max_request_body
        length = self.request.headers.get("Content-Length")
        if length is not None and length.strip().isdigit() and int(length) > limit:
            raise web.HTTPError(413, body_too_large(limit))
        self._body = bytearray()

    def data_received(self, chunk: bytes) -> None:
        # A body without a Content-Length (chunked) is counted as it comes: past the limit
        # nothing more is kept and tornado drops the connection.
        body = self._body if self._body is not None else bytearray()
        if len(body) + len(chunk) > self.app.max_request_body:
            self._body = bytearray()
            raise web.HTTPError(413, body_too_large(self.app.max_request_body))
        body += chunk
        self._body = body

    @property
    def body(self) -> bytes:
        """The request's body, as read (at most MLClusterApp.max_request_body)."""
        return bytes(self._body or b"")

    @property
    def app(self) -> MLClusterApp:
        return self.settings["mlcluster"]

    async def run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Blocking work in the extension's executor. On a shared server a caller holds at
        most `executor_threads_per_caller` threads at once (caller_slots.py)."""
        scope = self.scope()
        if scope is None:  # a personal server: its one user's requests are all there are
            return await self.app.run(fn, *args, **kwargs)
        async with self.app.caller_slots.hold(scope):
            return await self.app.run(fn, *args, **kwargs)

    async def wait_for_job(
        self, job_id: str, done: Callable[[JobRecord], bool], timeout: float
    ) -> JobRecord:
        """The job's record once `done(record)`, or as it stands after `timeout` seconds.
        Waits on the event loop, woken by the broadcaster's change feed (a look a second at
        most otherwise), holding no executor thread between looks: a stop that takes its
        ranks' grace costs the server nothing while it waits."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        with self.app.broadcaster.job_changed(job_id) as changed:
            while True:
                changed.clear()
                record = await self.run(self.app.service.store.get_job, job_id)
                left = deadline - loop.time()
                if done(record) or left <= 0:
                    return record
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(changed.wait(), min(left, WAIT_BACKSTOP))

    def user_name(self) -> str:
        user = self.current_user
        return getattr(user, "username", None) or getattr(user, "name", None) or str(user)

    def caller(self) -> str:
        """Who owns what this request creates: the trusted header's identity when the server
        takes it (MLClusterApp.trust_identity_header; 403 without one), else the Jupyter user."""
        try:
            return self.app.user_identity(self.current_user, self.request.headers)
        except IdentityError as exc:
            raise web.HTTPError(403, str(exc)) from None

    def scope(self) -> str | None:
        """Whose jobs this request may see and touch: only the caller's own when identity
        comes from the trusted header (a server shared by several users); None (every job)
        on a personal server, whose one user owns them all."""
        return self.caller() if self.app.trust_identity_header else None

    def query(self) -> dict[str, Any]:
        try:
            return self.app.validators.query(
                self.api_path, self.request.method.lower(), self.request.query_arguments
            )
        except RequestError as exc:
            raise web.HTTPError(400, str(exc)) from None

    def json_body(self) -> Any:
        try:
            return self.app.validators.body(self.api_path, self.request.method.lower(), self.body)
        except RequestError as exc:
            raise web.HTTPError(400, str(exc)) from None

    def send(self, value: Any, status: int = 200) -> None:
        self.set_status(status)
        self.finish(json.dumps(value, allow_nan=False))

    async def send_encoded(self, fn: Callable[[], Any], status: int = 200) -> None:
        """Build and encode a (possibly large) reply in the executor; write it here."""
        text = await self.run(lambda: json.dumps(fn(), allow_nan=False))
        self.set_status(status)
        self.finish(text)

    async def job(self, ref: str) -> JobRecord:
        """The job an `{id}` names (an id, or a name: the newest job with it) or 404.
        A malformed reference is refused before anything looks at the store. Another user's
        job (see `scope`) looks exactly like a missing one, so nobody learns which exist."""
        if not patterns.matches(patterns.JOB_REF, ref):
            raise web.HTTPError(404, f"no job {ref!r}")
        scope = self.scope()
        try:
            return await self.run(self.app.service.get, ref, owner=scope)
        except UnknownJob:
            raise web.HTTPError(404, f"no job {ref!r}") from None

    def api_url(self, *parts: str) -> str:
        return url_path_join(self.base_url, API_PREFIX, *parts)
