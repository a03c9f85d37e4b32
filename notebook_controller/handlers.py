"""kopf handlers of the notebook-controller: level-based, idempotent, restart-safe.

Every trigger (a Notebook created, changed or resumed after a restart; an owned object changed
or deleted; a pod or StatefulSet status change; a periodic resync) runs the same idempotent
steps: compute the desired objects, create what is missing, patch what drifted, recompute the
status. Names are deterministic and every child carries its ownerReference from the create
call on, so a controller killed at any moment leaves nothing it cannot finish or that the
garbage collector will not clean up. A kopf index mirrors the Notebooks and owned.py the
objects they own, so a reconcile that finds everything in shape makes no API call at all.

Resync and culling run as the controller's own loops over those indexes rather than as kopf
timers: kopf puts a finalizer on every object that has a timer, and a Notebook must stay
deletable while the controller is down.

The pure parts the handlers call are objects.py, status.py and events.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import datetime
import json
import logging
from collections.abc import AsyncIterator, Mapping
from typing import Any

import aiohttp
import kopf

from jupyterlab_mlcluster.kubeconn import BackoffSchedule, KubeError, backoff_from_env

from . import objects
from .config import ControllerConfig
from .crd import API_VERSION, GROUP, KIND, PLURAL, VERSION
from .culler import Culler
from .echoes import OwnWrites
from .events import mirrored_event, notebook_of_event
from .keyed_locks import KeyedLocks
from .kopf_state import MemoryDiffBaseStorage, MemoryProgressStorage
from .kube import KubeClient, connection_info
from .metrics import OWNED_EVENTS, RECONCILE_ERRORS, RECONCILES, MetricsServer
from .namespaces import foreign_owner_error
from .owned import API_VERSIONS, OWNED_KINDS, OwnedObjects, notebook_of
from .owners import NamespaceOwners
from .slim import slim_notebook
from .status import compute_status, status_changed

log = logging.getLogger("notebook_controller")
NotebookKey = tuple[str, str]  # namespace, name
_PERMANENT_STATUSES = frozenset({400, 403, 422})
KOPF_PREFIX = f"kopf.{GROUP}"


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _raw(body: Mapping[str, Any]) -> dict[str, Any]:
    return copy.deepcopy(dict(body))


def _one(index: Any, key: Any, owner_uid: str | None = None) -> dict[str, Any] | None:
    """The live (not terminating) object under a kopf index key, if any; with `owner_uid`,
    only one whose ownerReferences name that owner (a label anyone may set says nothing)."""
    values = list(index.get(key, ())) if index is not None else []
    if owner_uid is not None:
        values = [v for v in values if _owned_by(v, owner_uid)]
    live = [v for v in values if not v["metadata"].get("deletionTimestamp")]
    return (live or values or [None])[-1]


def _logger_of(notebook: Mapping[str, Any]) -> Any:
    meta = notebook["metadata"]
    return logging.LoggerAdapter(log, {"notebook": f"{meta['namespace']}/{meta['name']}"})


def _owned_by(obj: Mapping[str, Any], owner_uid: str) -> bool:
    return any(ref.get("uid") == owner_uid for ref in obj["metadata"].get("ownerReferences") or [])


class NotOurs(Exception):
    """An object with the name a child must have exists, and this Notebook does not own it."""


class NotebookController:
    """State shared by the handlers: settings, API client, Istio versions, HTTP session."""

    def __init__(self, config: ControllerConfig) -> None:
        self.config = config
        self.kube: KubeClient | None = None
        self.http: aiohttp.ClientSession | None = None
        self.istio = objects.IstioVersions(None, None)
        self.indexes: dict[str, Any] = {}
        self._loops: list[asyncio.Task[None]] = []
        self._locks = KeyedLocks()  # a Notebook's reconciles and repairs one at a time
        # Reconciles in progress at once (see _turn).
        self._slots = asyncio.Semaphore(max(1, config.max_concurrent_reconciles))
        # The last status written per notebook: the index lags our own writes by a watch event.
        # (As JSON text: a status kept as dicts costs kilobytes per notebook at 10,000.)
        self._written: dict[NotebookKey, str] = {}
        # Why the last reconcile of each notebook failed; partial passes must not forget it.
        self._errors: dict[NotebookKey, str] = {}
        # Our own writes of owned objects, until their watch events (the echoes) come back.
        self.own_writes = OwnWrites()
        self.owners: NamespaceOwners | None = None
        self._kopf_state: list[MemoryProgressStorage | MemoryDiffBaseStorage] = []
        self.metrics = MetricsServer()
        # What the Notebooks own, mirrored by watches of our own (owned.py), not kopf's.
        self.owned = OwnedObjects(self._owned_changed, config.namespaces)
        self._handling: set[asyncio.Task[None]] = set()  # owned events being handled

    # -- lifecycle -----------------------------------------------------------------------
    async def startup(self, logger: logging.Logger, **kwargs: Any) -> None:
        self.kube = await KubeClient.connect(self.config.kubeconfig, self.config.api_connections)
        self.owners = NamespaceOwners(self.kube)
        self.http = aiohttp.ClientSession()
        await self.discover_istio()
        logger.info(
            "Istio APIs: networking.istio.io %s, security.istio.io %s",
            self.istio.networking,
            self.istio.security,
        )
        # kopf gives startup handlers its live (still empty) index; the loops read it later.
        self.indexes = {"notebooks": kwargs.get("notebooks"), **self.owned.indexes}
        await self.owned.start(self.config.kubeconfig, self._owned_kinds())
        settings = kwargs.get("settings")
        if settings is not None:  # kopf's state of each Notebook, forgotten once it is gone
            self._kopf_state = [
                storage
                for storage in (
                    settings.persistence.progress_storage,
                    settings.persistence.diffbase_storage,
                )
                if isinstance(storage, MemoryProgressStorage | MemoryDiffBaseStorage)
            ]
        self._loops.append(
            asyncio.create_task(self._every(self.config.resync_period, self.resync_all))
        )
        if self.config.metrics_port:
            self.metrics.start(
                self.config.metrics_port, self.config.metrics_address, self._live_notebooks
            )
        if self.config.culling_enabled:
            culler = Culler(self.config, self.kube, self.http, self._live_notebooks)
            self._loops.append(
                asyncio.create_task(self._every(self.config.cull_check_period, culler.cull_all))
            )

    async def login(self, settings: kopf.OperatorSettings, **_: Any) -> kopf.ConnectionInfo:
        return await connection_info(self.config.kubeconfig, settings)

    async def cleanup(self, **_: Any) -> None:
        self.metrics.stop()
        for loop in self._loops:
            loop.cancel()
        await asyncio.gather(*self._loops, return_exceptions=True)
        await asyncio.to_thread(self.owned.stop)
        if self.http is not None:
            await self.http.close()
        if self.kube is not None:
            await self.kube.close()

    async def discover_istio(self) -> objects.IstioVersions:
        assert self.kube is not None
        if self.config.use_istio and (self.istio.networking is None or self.istio.security is None):
            self.istio = objects.IstioVersions(
                objects.preferred_istio_version(
                    await self.kube.served_versions("networking.istio.io")
                ),
                objects.preferred_istio_version(
                    await self.kube.served_versions("security.istio.io")
                ),
            )
            self.owned.watch(self._owned_kinds())  # (if it is started: startup does that)
        return self.istio

    def _owned_kinds(self) -> dict[str, str]:
        """What Notebooks own, kind -> apiVersion: the Istio kinds once they are served."""
        kinds = dict(API_VERSIONS)
        if self.config.use_istio and self.istio.networking:
            kinds["VirtualService"] = f"networking.istio.io/{self.istio.networking}"
        if self.config.use_istio and self.istio.security:
            kinds["AuthorizationPolicy"] = f"security.istio.io/{self.istio.security}"
        return kinds

    async def refusal(self, notebook: Mapping[str, Any]) -> str | None:
        """Why this Notebook gets no children at all: its owner is not one identity, or is not
        its namespace's owner (its route would admit that user on another user's origin)."""
        owner = notebook["spec"].get("owner")
        problem = objects.owner_error(owner)
        if problem:
            return f"refused: {problem}"
        namespace = notebook["metadata"]["namespace"]
        assert self.owners is not None
        owned_by, why = await self.owners.owner_of(namespace)
        return foreign_owner_error(owner, namespace, owned_by, why)

    @contextlib.asynccontextmanager
    async def _turn(self, key: NotebookKey) -> AsyncIterator[None]:
        """The notebook's lock, then a reconcile slot. kopf starts a handler for every
        object at once: unbounded, a burst of N Notebooks had N reconciles holding their
        copies while queued for the API (memory and GC work grew with N), all finishing near
        the end. The lock comes first (a child's event waiting for its Notebook's reconcile
        holds no slot); a slot's holder never waits for another lock, so it always gets on."""
        async with self._locks.hold(key), self._slots:
            yield

    # -- the Notebooks' index (kopf keeps it current from its watch) ------------------------
    # Index values are read, never changed; each keeps only what the handlers read (slim.py).
    # A coroutine: kopf runs a plain function in a thread, a hop per event.
    @staticmethod
    async def index_notebook(
        namespace: str, name: str, body: Mapping[str, Any], **_: Any
    ) -> dict[NotebookKey, Any]:
        return {(namespace, name): slim_notebook(body)}

    # -- reconciling ---------------------------------------------------------------------
    async def on_notebook(self, body: Mapping[str, Any], logger: logging.Logger, **_: Any) -> None:
        """create/update/resume/resync: bring every owned object and the status in line."""
        meta = body["metadata"]
        if meta.get("deletionTimestamp"):
            return
        key = (meta["namespace"], meta["name"])
        async with self._turn(key):
            notebook = _raw(body)  # once its turn came: a waiting one holds no copy
            # A full pass trusts the object's own status, not our memory of writing it.
            self._written.pop(key, None)
            with RECONCILES.time():
                error = await self._reconcile(notebook, logger)
        if error:
            RECONCILE_ERRORS.inc()
            raise kopf.TemporaryError(error, delay=self.config.retry_delay)

    async def reconcile(
        self,
        notebook: dict[str, Any],
        logger: logging.Logger,
        only_kind: str | None = None,
    ) -> str | None:
        meta = notebook["metadata"]
        async with self._turn((meta["namespace"], meta["name"])):
            return await self._reconcile(notebook, logger, only_kind)

    async def _reconcile(
        self,
        notebook: dict[str, Any],
        logger: logging.Logger,
        only_kind: str | None = None,
    ) -> str | None:
        """reconcile, in the notebook's turn (_turn)."""
        meta = notebook["metadata"]
        key = (meta["namespace"], meta["name"])
        istio = await self.discover_istio()
        await self.owned.listed()  # (before, it would create what exists)
        errors = []
        refused = await self.refusal(notebook)
        if refused:
            # Permanent until the notebook or its namespace changes (the resync looks
            # again): no retry loop, nothing created, the status says why.
            self._errors[key] = refused
            await self._write_status(notebook)
            logger.warning("Not reconciled: %s", refused)
            return None
        if self.config.use_istio and (istio.networking is None or istio.security is None):
            errors.append(
                "Istio is not installed in the cluster (networking.istio.io and "
                "security.istio.io must be served)"
            )
        for desired in objects.desired_children(notebook, self.config, istio):
            if only_kind is not None and desired["kind"] != only_kind:
                continue
            actual = _one(self.indexes.get(OWNED_KINDS[desired["kind"]][0]), key, meta["uid"])
            try:
                await self._ensure(desired, actual, logger)
            except NotOurs as exc:
                errors.append(str(exc))
            except KubeError as exc:
                if exc.status not in _PERMANENT_STATUSES:
                    raise
                errors.append(f"{desired['kind']} {desired['metadata']['name']}: {exc.message}")
        if errors:
            self._errors[key] = errors[0]
        elif only_kind is None:
            self._errors.pop(key, None)
        await self._write_status(notebook)
        return errors[0] if errors else None

    async def _ensure(
        self, desired: dict[str, Any], actual: dict[str, Any] | None, logger: logging.Logger
    ) -> None:
        assert self.kube is not None
        meta = desired["metadata"]
        if actual is None or actual["metadata"].get("uid") is None:
            try:
                self.own_writes.wrote(await self.kube.create(desired))
                logger.info("Created %s %s", desired["kind"], meta["name"])
                return
            except KubeError as exc:
                if exc.status != 409:
                    raise
            actual = await self.kube.get(
                desired["apiVersion"], desired["kind"], meta["namespace"], meta["name"]
            )
            if actual is None:
                raise kopf.TemporaryError(
                    f"{desired['kind']} {meta['name']} is being replaced", delay=1
                )
        ours = desired["metadata"]["ownerReferences"][0]["uid"]
        if not _owned_by(actual, ours):
            # Never adopt: someone else's object under our name (a Service pointing at their
            # pod, say) stays theirs and untouched, and this notebook reports it.
            raise NotOurs(
                f"{desired['kind']} {meta['name']} exists and does not belong to this notebook;"
                " delete or rename it"
            )
        if actual["metadata"].get("deletionTimestamp"):
            raise kopf.TemporaryError(
                f"waiting for the old {desired['kind']} {meta['name']} to go", delay=1
            )
        patch = objects.repair_patch(desired, actual)
        if patch:
            self.own_writes.wrote(
                await self.kube.patch(
                    desired["apiVersion"], desired["kind"], meta["namespace"], meta["name"], patch
                )
            )
            logger.info("Repaired %s %s: %s", desired["kind"], meta["name"], sorted(patch))

    async def _write_status(self, notebook: dict[str, Any]) -> None:
        assert self.kube is not None
        meta = notebook["metadata"]
        key = (meta["namespace"], meta["name"])
        sts = _one(self.indexes.get(OWNED_KINDS["StatefulSet"][0]), key, meta["uid"])
        pod = _one(self.indexes.get("owned_pods"), key, sts["metadata"]["uid"]) if sts else None
        status = compute_status(notebook, sts, pod, self._errors.get(key))
        if not status_changed(notebook, status):
            return
        written = self._written.get(key)
        if written is not None and not status_changed({"status": json.loads(written)}, status):
            return
        removed = {k: None for k in (notebook.get("status") or {}) if k not in status}
        try:
            await self.kube.patch(
                API_VERSION,
                KIND,
                meta["namespace"],
                meta["name"],
                {"status": {**removed, **status}},
                subresource="status",
            )
        except KubeError as exc:
            if exc.status != 404:  # the notebook went away meanwhile
                raise
        self._written[key] = json.dumps(status, separators=(",", ":"))

    def _notebook(self, namespace: str, name: str) -> dict[str, Any] | None:
        notebook = _one(self.indexes.get("notebooks"), (namespace, name))
        if notebook is None or notebook["metadata"].get("deletionTimestamp"):
            return None
        return notebook

    def _owned_changed(self, kind: str, type: str, body: dict[str, Any]) -> None:
        """A watch event of an owned object (owned.py, in the event loop, the index already
        has it): a pod's refreshes its Notebook's status; any other object's is put back in
        shape, unless it is the echo of our own write (most of a burst's events: nothing to
        do). An echo that comes before its write's reply is told apart in on_owned_event."""
        if kind == "Pod":
            work = self.on_pod_event(
                body["metadata"].get("namespace") or "", notebook_of(body) or ""
            )
        elif not self.own_writes.is_echo(type, body):
            work = self.on_owned_event(type, body)
        else:
            return
        task = asyncio.create_task(work)
        self._handling.add(task)
        task.add_done_callback(self._handled)

    def _handled(self, task: asyncio.Task[None]) -> None:
        self._handling.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("Handling an owned object's event failed", exc_info=task.exception())

    async def on_owned_event(self, type: str, body: Mapping[str, Any]) -> None:
        """An owned object changed or went away: put it back, and refresh the status."""
        namespace = body["metadata"].get("namespace") or ""
        notebook = self._notebook(namespace, notebook_of(body) or "")
        if notebook is None:
            return
        if not _owned_by(body, notebook["metadata"]["uid"]):
            return  # an earlier notebook's, or one only labelled like ours
        kind = body.get("kind")
        gone = type == "DELETED" or bool(body["metadata"].get("deletionTimestamp"))
        if gone and not any(
            c["kind"] == kind and c["metadata"]["name"] == body["metadata"]["name"]
            for c in objects.desired_children(notebook, self.config, self.istio)
        ):
            return  # e.g. a PVC that is no longer wanted
        logger = _logger_of(notebook)
        # Under the notebook's lock: the event of a create can come before its reply (most
        # do, from a watch thread), and the reconcile that made the object holds the lock
        # until the reply is in. Only then a reconcile slot: an echo waiting behind every
        # Notebook queued for one held its object meanwhile (at 3,000 Notebooks, 50 MiB).
        async with self._locks.hold((namespace, notebook["metadata"]["name"])):
            if self.own_writes.is_echo(type, body):
                return
            OWNED_EVENTS.labels(outcome="reconciled").inc()
            try:
                async with self._slots:
                    await self._reconcile(notebook, logger, only_kind=kind)
            except (KubeError, kopf.TemporaryError) as exc:
                logger.warning(
                    "Could not repair %s %s yet (the resync will): %s",
                    kind,
                    body["metadata"]["name"],
                    exc,
                )

    async def on_pod_event(self, namespace: str, name: str) -> None:
        """A pod of the Notebook `name` changed: its status, in its turn (the task waiting
        for a slot holds the names, not the pod)."""
        notebook = self._notebook(namespace, name)
        if notebook is None:
            return
        async with self._turn((namespace, name)):
            try:
                await self._write_status(notebook)
            except KubeError as exc:
                _logger_of(notebook).warning(
                    "Could not update the status of %s: %s", notebook["metadata"]["name"], exc
                )

    # -- spawn progress: pod events re-issued on the Notebook ------------------------------
    async def on_event(
        self,
        type: str | None,
        body: Mapping[str, Any],
        namespace: str,
        logger: logging.Logger,
        **_: Any,
    ) -> None:
        assert self.kube is not None
        name = notebook_of_event(body)
        notebook = self._notebook(namespace, name) if name else None
        if notebook is None or type == "DELETED":
            return
        if (body.get("lastTimestamp") or body["metadata"].get("creationTimestamp", "")) < notebook[
            "metadata"
        ].get("creationTimestamp", ""):
            return  # about an earlier notebook of the same name
        mirrored = mirrored_event(notebook, _raw(body), _now())
        try:
            await self.kube.create(mirrored)
        except KubeError as exc:
            if exc.status != 409:
                logger.warning("Could not re-issue event %s: %s", body["metadata"]["name"], exc)
                return
            await self.kube.patch(
                "v1",
                "Event",
                namespace,
                mirrored["metadata"]["name"],
                {k: mirrored[k] for k in ("count", "lastTimestamp", "message")},
            )

    # -- periodic work ------------------------------------------------------------------
    @staticmethod
    async def _every(period: float, action: Any) -> None:
        while True:
            await asyncio.sleep(period)
            try:
                await action()
            except Exception:
                log.exception("Periodic %s failed; trying again in %s s", action.__name__, period)

    def _live_notebooks(self) -> list[dict[str, Any]]:
        index = self.indexes.get("notebooks")
        found = [_one(index, key) for key in list(index or ())]
        return [
            nb for nb in found if nb is not None and not nb["metadata"].get("deletionTimestamp")
        ]

    async def resync_all(self) -> None:
        """Level-based safety net: reconcile every notebook (drift a watch may have missed)."""
        notebooks = self._live_notebooks()
        present = {(nb["metadata"]["namespace"], nb["metadata"]["name"]) for nb in notebooks}
        for memory in (self._written, self._errors):  # forget deleted notebooks
            for key in [key for key in memory if key not in present]:
                del memory[key]
        self.own_writes.forget_except(present)
        uids = {nb["metadata"]["uid"] for nb in notebooks}
        for storage in self._kopf_state:
            storage.forget_except(uids)
        for notebook in notebooks:
            meta = notebook["metadata"]
            logger = _logger_of(notebook)
            self._written.pop((meta["namespace"], meta["name"]), None)
            try:
                await self.reconcile(notebook, logger)
            except (KubeError, kopf.TemporaryError, aiohttp.ClientError) as exc:
                log.warning("Resync of %s/%s failed: %s", meta["namespace"], meta["name"], exc)


def build_settings(config: ControllerConfig) -> kopf.OperatorSettings:
    settings = kopf.OperatorSettings()
    # Handler progress and the last handled configuration live in memory (kopf_state.py),
    # not on the Notebook (the status belongs to its readers); the retry touch is an
    # annotation. kopf ignores every annotation under its own prefix when diffing, so it must
    # not share 'mlcluster.io/' with the stop annotation (or stop/start would go unnoticed).
    settings.persistence.progress_storage = MemoryProgressStorage(prefix=KOPF_PREFIX)
    settings.persistence.diffbase_storage = MemoryDiffBaseStorage()
    settings.posting.level = logging.WARNING
    # kopf's own requests (watches, patches) back off with the policy every other caller
    # uses (exponential, full jitter, capped) instead of kopf's fixed 1..21 s steps.
    settings.networking.error_backoffs = BackoffSchedule(backoff_from_env(), attempts=8)
    settings.watching.server_timeout = 600
    settings.watching.client_timeout = 660
    settings.peering.standalone = True
    settings.persistence.finalizer = f"{GROUP}/notebook-controller"  # none is expected to be added
    return settings


def build_registry(config: ControllerConfig) -> kopf.OperatorRegistry:
    """All handlers, bound to one NotebookController configured by ``config``."""
    registry = kopf.OperatorRegistry()
    controller = NotebookController(config)
    notebooks = (GROUP, VERSION, PLURAL)
    # kopf calls a handler with every keyword of its protocol (ActivityFn, IndexingFn, ...);
    # ours name those they read and take the rest as **kwargs, which mypy cannot match
    # against the protocols' full keyword lists: hence the `arg-type` ignores below.
    kopf.on.startup(registry=registry)(controller.startup)  # type: ignore[arg-type]
    kopf.on.cleanup(registry=registry)(controller.cleanup)
    kopf.on.login(registry=registry)(controller.login)
    kopf.index(*notebooks, registry=registry, id="notebooks")(
        controller.index_notebook  # type: ignore[arg-type]
    )
    if config.mirror_events:
        kopf.on.event("", "v1", "events", registry=registry, id="mirror_events")(
            controller.on_event  # type: ignore[arg-type]
        )
    for decorator in (kopf.on.create, kopf.on.update, kopf.on.resume):
        decorator(*notebooks, registry=registry, id="reconcile", backoff=config.retry_delay)(
            controller.on_notebook  # type: ignore[arg-type]
        )
    return registry
