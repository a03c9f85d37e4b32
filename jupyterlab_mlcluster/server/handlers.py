"""REST handlers of `/mlcluster/api` (see openapi.py for the document they implement).

Every method is `@web.authenticated` + `@authorized` (resource "mlcluster"); errors are
JSON `{"message": ...}`. Anything that touches SQLite, files, processes or Kubernetes runs
in the extension's executor (`self.run(...)`), never on the event loop.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Callable
from json.encoder import encode_basestring_ascii
from typing import TYPE_CHECKING, Any, TypeVar

from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import url_path_join
from tornado import web
from tornado.iostream import StreamClosedError

from .. import patterns
from ..jobs.model import JobSpec, JobState, SpecError, tensorboard_dir_for
from ..jobs.service import JobStillRunning, NoJSONForm
from ..jobs.store import UnknownJob
from ..kubeconn import ClusterUnavailable, KubeError, configuration_problem
from ..runtime.payload import Payload, PayloadError
from .identity import IdentityError
from .notebooks import (
    InvalidNotebook,
    NotebookExists,
    NotebookNotFound,
    QuotaExceeded,
    notebook_name_error,
)
from .openapi import API_PREFIX, RequestError
from .tensorboard import ENV_NAME as TENSORBOARD_ENV
from .tensorboard import (
    NoTensorBoardData,
    PlaceRefused,
    TensorBoardFailed,
    has_event_files,
    tensorboard_installed,
    tensorboard_location,
)
from .user_namespace import NamespaceTaken

if TYPE_CHECKING:
    from ..jobs.record import JobRecord
    from .app import MLClusterApp

T = TypeVar("T")
FOLLOW_READ_BYTES = 64 * 1024
PAGE_READ_BYTES = 1024 * 1024
# POST /jobs, on a server shared by many users, with a backend whose ranks run as the
# server's own account (local; slurm, whose allocations are the server's): the OpenAPI 403.
SHARED_LOCAL_REFUSED = (
    "this server is shared by many users: {backend} jobs would run as the server's one Unix "
    "user, where other users' jobs could read their files, environment and processes; submit "
    "with backend kubernetes (your own namespace), or run your own server "
    "(MLClusterApp.allow_local_jobs_when_shared is off)"
)


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
        return await self.app.run(fn, *args, **kwargs)

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


# -- jobs ---------------------------------------------------------------------------------


class JobsHandler(MLClusterHandler):
    api_path = "/jobs"

    @web.authenticated
    @authorized("read")
    async def get(self) -> None:
        q = self.query()
        states = sorted(set(q.get("state") or [])) or None
        scope = self.scope()

        def page() -> dict[str, Any]:
            jobs, total = self.app.service.list(
                states=states,
                backend=q.get("backend"),
                owner=scope,
                limit=q["limit"],
                offset=q["offset"],
            )
            return {
                "jobs": [j.to_json() for j in jobs],
                "total": total,
                "limit": q["limit"],
                "offset": q["offset"],
            }

        await self.send_encoded(page)

    @web.authenticated
    @authorized("execute")  # running code on the server's machine (or cluster), as a kernel does
    async def post(self) -> None:
        owner = self.caller()
        body = self.json_body()
        service = self.app.service
        options = {k: body[k] for k in JobSpec.FIELDS if k in body}
        try:
            spec = JobSpec.from_options(options, default_backend=service.config.default_backend)
        except SpecError as exc:
            raise web.HTTPError(400, str(exc)) from None
        if self.app.refuses_local_jobs:
            # Ranks that would run as this server's account (Backend.ranks_inherit_environment):
            # local processes, or Slurm tasks submitted with its credentials.
            backend = await self.run(service.backend, spec.backend)
            if backend.ranks_inherit_environment:
                raise web.HTTPError(403, SHARED_LOCAL_REFUSED.format(backend=spec.backend))
        if spec.backend == "kubernetes":
            problem = await self.run(configuration_problem)
            if problem:
                raise web.HTTPError(503, f"{problem}; the kubernetes backend needs one")
        await self.run(self.check_tensorboard_places, spec, owner)
        await self.run(self.check_quota, owner)
        namespace = await self.job_namespace(spec, owner)
        payload = Payload(kind="code", source=body["code"], pull=list(body.get("pull", [])))
        origin = {"kind": "rest", "user": owner, "server": self.app.server_id}
        try:
            record = await self.run(
                service.submit,
                spec,
                payload,
                origin=origin,
                environ=dict(os.environ),
                cwd=self.app.job_cwd,
                namespace=namespace,
            )
        except PayloadError as exc:
            raise web.HTTPError(400, str(exc)) from None
        except SpecError as exc:  # well-formed, but this backend can never run it
            raise web.HTTPError(409, str(exc)) from None
        self.set_header("Location", self.api_url("jobs", record.id))
        self.send(record.to_json(), status=201)

    def check_quota(self, owner: str) -> None:
        """A caller's kept jobs and their bytes in the store, against the shared server's
        per-user quotas (MLClusterApp.owner_job_quota, owner_store_quota_mib): 403 at or over
        either, before anything is stored. Nothing to do on a server without them."""
        app = self.app
        jobs, stored = app.job_quota, app.store_quota_bytes
        if not (jobs or stored):
            return
        store = app.service.store
        records, kept = store.list_jobs(owner=owner, limit=None if stored else 0)
        purge = "purge jobs you no longer need (DELETE /jobs/{id}?purge=true) to submit more"
        if jobs and kept >= jobs:
            raise web.HTTPError(
                403,
                f"you keep {kept} jobs in this server's store, as many as one user may "
                f"(MLClusterApp.owner_job_quota = {jobs}): {purge}",
            )
        if stored:
            used = sum(directory_bytes(store.job_dir(r.id)) for r in records)
            if used >= stored:
                raise web.HTTPError(
                    403,
                    f"your jobs hold {used / (1 << 20):.1f} MiB of this server's store, as much "
                    f"as one user may (MLClusterApp.owner_store_quota_mib = {stored >> 20}): "
                    f"{purge}",
                )

    def check_tensorboard_places(self, spec: JobSpec, owner: str) -> None:
        """On a shared server, the TensorBoard directory a job names (option or env) must be
        one the caller may have read (TensorBoardPlaces): else 400 before anything is stored."""
        places = self.app.tensorboard_places
        if places is None:
            return
        probe = "j" + "0" * 10  # {job}: an id's shape, in the job's own directory
        own_dir = str(self.app.service.store.tensorboard_dir(probe))
        for named in (spec.tensorboard, spec.env.get(TENSORBOARD_ENV)):
            if not named:
                continue
            try:
                places.check(named.replace("{job}", probe), owner, own_dir=own_dir)
            except PlaceRefused as exc:
                raise web.HTTPError(400, str(exc)) from None

    async def job_namespace(self, spec: JobSpec, owner: str) -> str | None:
        """Where a Kubernetes job's objects go: the caller's own namespace when the server
        maps users to namespaces (as for notebooks), else None (the configured one). Never
        the request's say: a body naming a namespace is refused by the schema (400)."""
        namespace_of = self.app.namespace_of
        if spec.backend != "kubernetes" or namespace_of is None:
            return None
        try:
            return await self.run(namespace_of, owner)
        except NamespaceTaken as exc:
            raise web.HTTPError(403, str(exc)) from None
        except ClusterUnavailable as exc:
            raise web.HTTPError(503, str(exc)) from None
        except KubeError as exc:  # e.g. Profiles served but not readable: never guess
            raise web.HTTPError(502, str(exc)) from None


class JobHandler(MLClusterHandler):
    api_path = "/jobs/{id}"

    @web.authenticated
    @authorized("read")
    async def get(self, ref: str) -> None:
        self.send((await self.job(ref)).to_json())

    @web.authenticated
    @authorized("write")
    async def delete(self, ref: str) -> None:
        purge = self.query()["purge"]
        record = await self.job(ref)
        try:
            after = await self.run(self.app.service.cancel, record.id, purge=purge, wait=True)
        except UnknownJob:  # purged by someone else meanwhile
            raise web.HTTPError(404, f"no job {ref!r}") from None
        except JobStillRunning as exc:  # e.g. its supervisor on another host still beats
            raise web.HTTPError(409, str(exc)) from None
        if after is None:
            self.set_status(204)
            self.finish()
        else:
            self.send(after.to_json())


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
            raise web.HTTPError(
                400, f"rank must be between 0 and {record.spec.workers - 1}, got {rank}"
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
        Woken by the store's change feed (no polling); waits for the client between writes."""
        service, broadcaster = self.app.service, self.app.broadcaster

        def read(cursor: str | None, tail: int | None) -> tuple[bytes, str, bool]:
            final = service.store.get_job(job_id).final
            lines, cursor = service.logs(
                job_id, rank, cursor, max_bytes=FOLLOW_READ_BYTES, tail=tail
            )
            if lines:
                # Where to resume after this batch, should the stream break: a client
                # reconnects with `since=<cursor>` instead of reloading everything.
                lines[-1] = {**lines[-1], "cursor": cursor}
            return ndjson(lines), cursor, final

        self.set_header("Content-Type", "application/x-ndjson")
        self.set_header("Cache-Control", "no-cache")
        self.set_header("X-Accel-Buffering", "no")  # let reverse proxies stream it
        with broadcaster.job_changed(job_id) as changed:
            self._changed = changed
            try:
                while not self._closed:
                    changed.clear()
                    try:
                        data, cursor, final = await self.run(read, cursor, tail)
                    except UnknownJob:
                        break  # purged while we followed it
                    tail = None
                    if data:
                        self.write(data)
                        await self.flush()
                        continue  # there may be more already
                    if final:
                        break
                    await changed.wait()
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
        since = self.query().get("since")
        record = await self.job(ref)

        def metrics() -> dict[str, Any]:
            history = self.app.service.store.metrics_history(record.id, since)
            ranks = []
            for rank in record.to_json()["ranks"]:
                ranks.append(
                    {
                        "rank": rank["rank"],
                        "current": rank["metrics"],
                        "series": history.get(rank["rank"], []),
                    }
                )
            return {"id": record.id, "ranks": ranks}

        await self.send_encoded(metrics)


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


def directory_bytes(path: Any) -> int:
    """Bytes of the files under `path` (symlinks not followed; a missing one is 0). Blocking."""
    total, stack = 0, [str(path)]
    while stack:
        try:
            with os.scandir(stack.pop()) as it:
                for entry in it:
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(entry.path)
                    elif entry.is_file(follow_symlinks=False):
                        total += entry.stat(follow_symlinks=False).st_size
        except (FileNotFoundError, NotADirectoryError):
            continue
    return total


def ndjson(lines: list[dict[str, Any]]) -> bytes:
    """Log lines as newline-delimited JSON, the same objects json.dumps would give, about
    five times faster (a flat-out job prints ~100k lines/s; this runs while it does)."""
    return "".join(
        '{"rank": %d, "ts": "%s", "stream": "%s", "line": %s}\n'  # noqa: UP031 - fastest here
        % (line["rank"], line["ts"], line["stream"], encode_basestring_ascii(line["line"]))
        for line in lines
    ).encode()


# -- cluster, document ----------------------------------------------------------------------


class ClusterHandler(MLClusterHandler):
    api_path = "/cluster"

    @web.authenticated
    @authorized("read")
    async def get(self) -> None:
        scope = self.scope()
        await self.send_encoded(lambda: self.app.service.cluster(owner=scope))


class OpenAPIHandler(MLClusterHandler):
    api_path = "/openapi.json"

    @web.authenticated
    @authorized("read")
    async def get(self) -> None:
        document = dict(self.app.document)
        document["servers"] = [{"url": self.api_url()}]
        self.send(document)


# -- notebook servers (Kubernetes) -------------------------------------------------------------


class NotebookHandlerBase(MLClusterHandler):
    """The caller's own notebook servers. Another user's look exactly like missing ones (404),
    so nobody learns which names others use."""

    async def call(self, method: str, *args: Any) -> Any:
        owner = self.caller()
        try:
            return await self.run(getattr(self.app.notebooks, method), owner, *args)
        except InvalidNotebook as exc:
            raise web.HTTPError(400, str(exc)) from None
        except NotebookNotFound as exc:
            raise web.HTTPError(404, str(exc)) from None
        except NotebookExists as exc:
            raise web.HTTPError(409, str(exc)) from None
        except (QuotaExceeded, NamespaceTaken) as exc:
            raise web.HTTPError(403, str(exc)) from None
        except ClusterUnavailable as exc:
            raise web.HTTPError(503, str(exc)) from None
        except KubeError as exc:  # the API server answered, and refused
            raise web.HTTPError(502, str(exc)) from None


class NotebooksHandler(NotebookHandlerBase):
    api_path = "/notebooks"

    @web.authenticated
    @authorized("read")
    async def get(self) -> None:
        self.send({"notebooks": await self.call("list")})

    @web.authenticated
    @authorized("write")
    async def post(self) -> None:
        created = await self.call("create", self.spawn_request())
        self.set_header("Location", self.api_url("notebooks", created["name"]))
        self.send(created, status=201)

    def spawn_request(self) -> dict[str, Any]:
        """The validated body; a bad name is refused in the name validator's own words."""
        try:
            return self.json_body()
        except web.HTTPError:
            name = _json_field(self.body, "name")
            problem = notebook_name_error(name) if isinstance(name, str) else None
            if problem:
                raise web.HTTPError(400, f"name: {problem}") from None
            raise


class NamedNotebookHandler(NotebookHandlerBase):
    async def call_named(self, method: str, name: str) -> Any:
        problem = notebook_name_error(name)
        if problem:
            raise web.HTTPError(400, problem)
        return await self.call(method, name)


class NotebookHandler(NamedNotebookHandler):
    api_path = "/notebooks/{name}"

    @web.authenticated
    @authorized("read")
    async def get(self, name: str) -> None:
        self.send(await self.call_named("get", name))

    @web.authenticated
    @authorized("write")
    async def delete(self, name: str) -> None:
        await self.call_named("delete", name)
        self.set_status(204)
        self.finish()


class NotebookStopHandler(NamedNotebookHandler):
    api_path = "/notebooks/{name}/stop"

    @web.authenticated
    @authorized("write")
    async def post(self, name: str) -> None:
        self.send(await self.call_named("stop", name))


class NotebookStartHandler(NamedNotebookHandler):
    api_path = "/notebooks/{name}/start"

    @web.authenticated
    @authorized("write")
    async def post(self, name: str) -> None:
        self.send(await self.call_named("start", name))


def _json_field(raw: bytes, key: str) -> Any:
    """`key` of a JSON object body, or None when the body is no such thing."""
    try:
        value = json.loads(raw or b"null")
    except (ValueError, RecursionError):
        return None
    return value.get(key) if isinstance(value, dict) else None


REST_HANDLERS: list[type[MLClusterHandler]] = [
    JobsHandler,
    JobHandler,
    LogsHandler,
    MetricsHandler,
    TensorBoardHandler,
    ResultHandler,
    ClusterHandler,
    OpenAPIHandler,
    NotebooksHandler,
    NotebookHandler,
    NotebookStopHandler,
    NotebookStartHandler,
]
