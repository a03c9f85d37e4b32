"""REST handlers of jobs: `/jobs` (list, submit) and `/jobs/{id}` (get, cancel, purge).

A submit is judged before anything is stored: the schema, the spec's own checks, a shared
server's refusals (backends whose ranks run as the server, quotas, TensorBoard places) and
the caller's namespace for a Kubernetes job.
"""

from __future__ import annotations

import json
import os
from typing import Any

from jupyter_server.auth.decorator import authorized
from tornado import web

from ...jobs.model import JobSpec, SpecError
from ...jobs.service import STOP_SLACK, JobStillRunning
from ...jobs.storage.store import UnknownJob
from ...kubeconn import ClusterUnavailable, KubeError, configuration_problem
from ...runtime.payload import Payload, PayloadError
from ..tensorboard import ENV_NAME as TENSORBOARD_ENV
from ..tensorboard import PlaceRefused
from ..user_namespace import NamespaceTaken
from .base import MLClusterHandler

# POST /jobs, on a server shared by many users, with a backend whose ranks run as the
# server's own account (local; slurm, whose allocations are the server's): the OpenAPI 403.
SHARED_LOCAL_REFUSED = (
    "this server is shared by many users: {backend} jobs would run as the server's one Unix "
    "user, where other users' jobs could read their files, environment and processes; submit "
    "with backend kubernetes (your own namespace), or run your own server "
    "(MLClusterApp.allow_local_jobs_when_shared is off)"
)
SHARED_MLFLOW_REFUSED = (
    "this server is shared by many users and names no MLflow tracking server: --track mlflow "
    "would record every user's runs in one local store of the server's account; the operator "
    "sets MLClusterConfig.mlflow_tracking_uri (or submit without --track mlflow)"
)


class JobsHandler(MLClusterHandler):
    api_path = "/jobs"

    @web.authenticated
    @authorized("read")
    async def get(self) -> None:
        q = self.query()
        states = sorted(set(q.get("state") or [])) or None
        scope = self.scope()

        def page() -> str:
            jobs, total = self.app.service.list_json(
                states=states,
                backend=q.get("backend"),
                owner=scope,
                parent=q.get("parent"),
                limit=q["limit"],
                offset=q["offset"],
            )
            # The jobs come as JSON text each (rendered once per change): joined, not
            # parsed and encoded again. Byte for byte what json.dumps of the page would say.
            rest = json.dumps({"total": total, "limit": q["limit"], "offset": q["offset"]})
            return '{"jobs": [' + ", ".join(jobs) + "], " + rest[1:]

        text = await self.run(page)
        self.finish(text)

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
        if self.app.trust_identity_header and (spec.track or service.config.track) == "mlflow":
            if not service.config.mlflow_tracking_uri:
                # The default local store would be one for every user, in this server's store.
                raise web.HTTPError(403, SHARED_MLFLOW_REFUSED)
        await self.run(self.check_quota, owner)
        namespace = await self.job_namespace(spec, owner)
        payload = Payload(kind="code", source=body["code"], pull=list(body.get("pull", [])))
        origin: dict[str, Any] = {"kind": "rest", "user": owner, "server": self.app.server_id}
        if self.app.trust_identity_header:  # (its MLflow experiments go under the owner's name)
            origin["shared"] = True
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
        service = self.app.service
        try:
            if not record.final:
                # Asked in the executor, waited for on the event loop (the ranks' grace may
                # be long); then the blocking cancel below finds the job final at once, or
                # kills a wedged supervisor as it would have.
                await self.run(service.cancel, record.id, wait=False)
                grace = await self.run(service.job_grace, record.id) + STOP_SLACK
                await self.wait_for_job(record.id, lambda r: r.final, grace)
            after = await self.run(service.cancel, record.id, purge=purge, wait=True)
        except UnknownJob:  # purged by someone else meanwhile
            raise web.HTTPError(404, f"no job {ref!r}") from None
        except JobStillRunning as exc:  # e.g. its supervisor on another host still beats
            raise web.HTTPError(409, str(exc)) from None
        if after is None:
            self.set_status(204)
            self.finish()
        else:
            self.send(after.to_json())


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
