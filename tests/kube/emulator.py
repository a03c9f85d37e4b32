"""A realistic Kubernetes API server for tests: kmock's KubernetesEmulator, made strict.

``RealisticKubernetes`` subclasses ``kmock.KubernetesEmulator`` and keeps kmock's HTTP server,
request objects, discovery endpoints and reaction DSL (so a test can still inject a fault with
``kube['post /api/v1/namespaces/x/pods'] << 500``). Every resource request that no test
reaction claims is served by the realistic API below instead of kmock's loose defaults:

- 201 on create with uid, resourceVersion, creationTimestamp, generation, generateName;
  409 AlreadyExists / Conflict, 404 NotFound, 422 Invalid, 400 BadRequest as ``Status`` objects;
- one monotonically increasing resourceVersion; stale resourceVersions on update -> 409;
- list/watch with label selectors (equality and set-based) and field selectors; paging;
- watch from a resourceVersion with timeoutSeconds, bookmarks, sendInitialEvents, 410 Gone;
- the status subresource; merge, strategic-merge and JSON patches;
- finalizers, ownerReference garbage collection (background, foreground, orphan), namespace
  termination; CRDs installed through the API appear in discovery and validate their objects;
- pod logs (``follow``, ``container``, ``timestamps``, ``sinceTime``, ``tailLines``).

``EmulatorThread`` serves one on 127.0.0.1 from its own thread and event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import re
import threading
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import aiohttp.web
import attrs
import kmock
from kmock._internal import dsl as kmock_dsl
from kmock._internal.rendering import ReactionMismatchError

from . import rules
from .catalogue import NAMESPACES, PODS, Catalogue
from .deletion import Deletion
from .logs import PodLogEndpoint, PodLogs
from .protocol import ApiError, ApiPath, json_reply, parse_api_path
from .reads import Reads
from .store import GroupResource, Key, Store
from .writes import Writes

T = TypeVar("T")
SERVER_VERSION = {
    "major": "1",
    "minor": "33",
    "gitVersion": "v1.33.0+kmock-realistic",
    "gitCommit": "60a317eadfcb839692a5b8d8b05a8dc8b2eb0b7b",
    "gitTreeState": "clean",
    "buildDate": "2025-04-23T13:07:02Z",
    "goVersion": "go1.24.2",
    "compiler": "gc",
    "platform": "linux/amd64",
}
MAX_REQUEST_BYTES = 3 * 1024 * 1024  # the kube-apiserver's MaxRequestBodyBytes
_METHODS = {method.value: method for method in kmock.method}


class _ServeRealistically(Exception):
    """Raised by the lowest-priority reaction: no test reaction claimed this request."""


def _chain_matches(reaction: Any, request: kmock.Request) -> bool:
    """Whether `request` reaches `reaction` through its chain of filters and priorities (as
    kmock finds by filtering every request it holds); False for a chain of other views."""
    view = reaction._source
    while not isinstance(view, kmock_dsl.Root):
        if type(view) is kmock_dsl.Filter:
            if not view.criteria(request):
                return False
        elif not isinstance(view, kmock_dsl.Priority):
            return False
        view = view._source
    return True


@attrs.define(kw_only=True)
class RealisticKubernetes(Reads, Writes, Deletion, PodLogEndpoint, kmock.KubernetesEmulator):
    """kmock's emulator with the semantics of a real kube-apiserver (see module docstring)."""

    event_window: int = 10_000  # watch history kept; older resourceVersions get 410 Gone
    bookmark_interval: float = 60.0  # seconds between BOOKMARK events on quiet watches
    default_watch_timeout: float = 1800.0  # when the client sends no timeoutSeconds
    gc_delay: float = 0.005  # the garbage collector batches work after this pause
    request_history: int = 2_000  # requests kept for kmock-style assertions (bounded memory)

    _store: Store = attrs.field(init=False)
    _catalogue: Catalogue = attrs.field(init=False, factory=Catalogue)
    _logs: PodLogs | None = attrs.field(init=False, default=None)
    _gc_task: asyncio.Task[None] | None = attrs.field(init=False, default=None)
    _gc_wakeup: asyncio.Event | None = attrs.field(init=False, default=None)
    _gc_orphans: set[tuple[GroupResource, Key]] = attrs.field(init=False, factory=set)
    _gc_foreground: set[tuple[GroupResource, Key]] = attrs.field(init=False, factory=set)
    _gc_namespaces: set[str] = attrs.field(init=False, factory=set)
    _closing: bool = attrs.field(init=False, default=False)
    _request_count: int = attrs.field(init=False, default=0)
    _own_payloads: frozenset[int] = attrs.field(init=False, factory=frozenset)
    _own_in_order: list[Any] = attrs.field(init=False, factory=list)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self._store = Store(window=self.event_window)
        for name in ("default", "kube-system", "kube-public", "kube-node-lease"):
            namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
            self._new_object_meta(namespace)
            rules.apply_create_defaults(NAMESPACES, namespace)
            self._store.put(NAMESPACES, namespace)
        # Above kmock's own loose fallbacks, below anything a test declares.
        (self.fallback**1)[self._is_resource_request] << self._serve_realistically
        # Real API servers answer discovery paths with a trailing slash too (the Python
        # client's VersionApi, CoreApi and CoreV1Api ask for /version/, /api/, /api/v1/).
        self.fallback["get /version/"] << self._serve_server_version
        self.fallback["get /api/"] << self._serve_api
        self.fallback["get /apis/"] << self._serve_apis
        self.fallback["get", re.compile(r"/api/[^/]+/")] << self._serve_version
        self.fallback["get", re.compile(r"/apis/[^/]+/")] << self._serve_group
        self.fallback["get", re.compile(r"/apis/[^/]+/[^/]+/")] << self._serve_version
        self._own_payloads = frozenset(id(payload) for payload in self._payloads)
        # kmock's order of reactions (RawHandler._handle): highest priority first, priorities
        # padded with zeroes to one length, ties in the order they were declared.
        longest = max(len(p.priorities) for p in self._payloads)
        self._own_in_order = sorted(
            self._payloads,
            key=lambda p: tuple(-x for x in p.priorities) + (0,) * (longest - len(p.priorities)),
        )

    # -- kmock plumbing --------------------------------------------------------------------
    async def __aenter__(self) -> RealisticKubernetes:
        await super().__aenter__()
        self._logs = PodLogs()
        self._gc_wakeup = asyncio.Event()
        self._gc_task = asyncio.create_task(self._gc_loop())
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close_streams()
        if self._gc_task is not None:
            self._gc_task.cancel()
        await super().__aexit__(*exc)

    async def close_streams(self) -> None:
        """End every open watch and log stream (before the HTTP server stops)."""
        self._closing = True
        for watcher in list(self._store.watchers):
            watcher.queue.put_nowait(None)  # type: ignore[arg-type]  # wakes the stream to end
        if self._logs is not None:
            await self._logs.notify()

    async def __call__(self, raw: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        # kmock 0.8 cannot parse some valid paths (e.g. GET /api/v1/namespaces), so resource
        # requests are parsed here and handed to kmock's dispatch as ordinary kmock Requests.
        # Bodies up to the kube-apiserver's limit (aiohttp's default is 1 MiB).
        raw = raw.clone(client_max_size=MAX_REQUEST_BYTES)
        body = await raw.read()
        try:
            data = json.loads(body) if body else None
        except ValueError:
            data = None
        path = parse_api_path(raw.path)
        resource = kmock.resource(path.group, path.version, path.plural) if path else None
        self._request_count += 1
        request = kmock.Request(
            id=self._request_count,
            raw_request=raw,
            url=raw.url,
            # As the enum: kmock's converter guesses from a str by walking the enum's members.
            method=_METHODS.get(raw.method, raw.method),
            params=dict(raw.query),
            headers=dict(raw.headers),
            cookies=dict(raw.cookies),
            body=body,
            text=body.decode("utf-8", "replace"),
            data=data,
            action=self._guess_action(path, raw.method, raw.query.get("watch")),
            resource=resource,
            namespace=path.namespace if path else None,
            name=path.name if path else None,
            subresource=path.subresource if path else None,
        )
        self._requests.append(request)
        if len(self._requests) % 100 == 0:
            self._forget_old_requests()
        try:
            return await self._handle(request)
        except ApiError as exc:
            return json_reply(exc.code, exc.status())
        except Exception as exc:  # noqa: BLE001 - a test reaction failed: report it as kmock does
            if self._errors:
                self._errors[-1].append(exc)
            return await self._render_error(exc)

    def _forget_old_requests(self) -> None:
        # kmock keeps every request (on the root and on each reaction); bound that memory.
        for holder in [self, *self._payloads]:
            requests = holder._requests
            if len(requests) > self.request_history:
                del requests[: len(requests) - self.request_history]

    @staticmethod
    def _guess_action(path: ApiPath | None, method: str, watch: str | None) -> kmock.action | None:
        if path is None:
            return None
        if method == "GET" and watch in ("true", "1"):
            return kmock.action.WATCH
        table = (
            {
                "GET": kmock.action.FETCH,
                "PATCH": kmock.action.UPDATE,
                "PUT": kmock.action.UPDATE,
                "DELETE": kmock.action.DELETE,
            }
            if path.name
            else {"GET": kmock.action.LIST, "POST": kmock.action.CREATE}
        )
        return table.get(method)

    async def _handle(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        # kmock matches a request against each reaction by re-filtering the whole request
        # history (O(history) per request: ~2,000 requests through each reaction's criteria,
        # tens of ms a request). Without test reactions: straight to the API, and discovery
        # to our own reaction, its criteria applied to this request alone.
        if all(id(p) in self._own_payloads or p._disabled.is_set() for p in self._payloads):
            if self._is_resource_request(request):
                return await self._serve(request)
            for payload in self._own_in_order:
                if not payload._disabled.is_set() and _chain_matches(payload, request):
                    with contextlib.suppress(ReactionMismatchError, NotImplementedError):
                        return await payload(request)
        try:
            # kmock.RawHandler's dispatch, skipping KubernetesEmulator's loose object tracking.
            return await kmock.RawHandler._handle(self, request)
        except _ServeRealistically:
            return await self._serve(request)

    @staticmethod
    def _is_resource_request(request: kmock.Request) -> bool:
        return request.resource is not None and request.resource.plural is not None

    @staticmethod
    def _serve_realistically(request: kmock.Request) -> None:
        raise _ServeRealistically()

    # -- discovery ---------------------------------------------------------------------------
    async def _serve_root(self, request: kmock.Request) -> dict[str, Any]:
        paths = {"/api", "/api/v1", "/apis", "/version"}
        for group, versions in self._catalogue.groups().items():
            if group:
                paths |= {f"/apis/{group}"} | {f"/apis/{group}/{v}" for v in versions}
        return {"paths": sorted(paths)}

    async def _serve_server_version(self, request: kmock.Request) -> dict[str, Any]:
        return dict(SERVER_VERSION)

    async def _serve_api(self, request: kmock.Request) -> dict[str, Any]:
        return {
            "kind": "APIVersions",
            "versions": ["v1"],
            "serverAddressByClientCIDRs": [
                {"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}
            ],
        }

    def _group_doc(self, group: str, versions: list[str]) -> dict[str, Any]:
        entries = [{"groupVersion": f"{group}/{v}", "version": v} for v in versions]
        return {"name": group, "versions": entries, "preferredVersion": entries[0]}

    async def _serve_apis(self, request: kmock.Request) -> dict[str, Any]:
        groups = [self._group_doc(g, vs) for g, vs in sorted(self._catalogue.groups().items()) if g]
        return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}

    async def _serve_group(self, request: kmock.Request) -> dict[str, Any]:
        group = request.url.path.strip("/").split("/")[1]
        versions = self._catalogue.groups().get(group)
        if not group or not versions:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        return {"kind": "APIGroup", "apiVersion": "v1", **self._group_doc(group, versions)}

    async def _serve_version(self, request: kmock.Request) -> dict[str, Any]:
        parts = request.url.path.strip("/").split("/")
        group, version = ("", parts[1]) if parts[0] == "api" else (parts[1], parts[2])
        types = [r for r in self._catalogue.all() if (r.group, r.version) == (group, version)]
        if not types:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        return {
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": f"{group}/{version}" if group else version,
            "resources": [
                e for r in sorted(types, key=lambda r: r.plural) for e in r.discovery_entries()
            ],
        }

    # -- dispatch ----------------------------------------------------------------------------
    async def _serve(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        raw = request._raw_request
        assert raw is not None
        path = parse_api_path(raw.path)
        assert path is not None
        rtype = self._catalogue.get(path.group, path.version, path.plural)
        if rtype is None or (path.namespace is not None and not rtype.namespaced):
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        method, params, sub = raw.method, request.params, path.subresource
        ns = path.namespace if rtype.namespaced else None
        if path.name is None:
            if method == "GET" and params.get("watch") in ("true", "1"):
                return await self._watch(raw, rtype, ns, params)
            handlers: dict[str, Callable[[], Any]] = {
                "GET": lambda: self._list(rtype, ns, params),
                "POST": lambda: self._create(rtype, ns, request),
                "DELETE": lambda: self._delete_collection(rtype, ns, request),
            }
        elif sub is None:
            handlers = {
                "GET": lambda: self._get(rtype, ns, path.name),
                "PUT": lambda: self._replace(rtype, ns, path.name, request, None),
                "PATCH": lambda: self._patch(rtype, ns, path.name, request, None),
                "DELETE": lambda: self._delete_request(rtype, ns, path.name, request),
            }
        elif sub == "status" and rtype.has_status:
            handlers = {
                "GET": lambda: self._get(rtype, ns, path.name),
                "PUT": lambda: self._replace(rtype, ns, path.name, request, "status"),
                "PATCH": lambda: self._patch(rtype, ns, path.name, request, "status"),
            }
        elif sub == "log" and rtype.group_resource == PODS and method == "GET":
            return await self._pod_log(raw, rtype, ns or "", path.name, params)
        else:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        if method not in handlers:
            raise ApiError(
                405,
                "MethodNotAllowed",
                "the server does not allow this method on the requested resource",
            )
        result = handlers[method]()
        return await result if isinstance(result, Awaitable) else result

    # -- for tests: things with no API -------------------------------------------------------
    def remove_reactions(self) -> None:
        """Drop every reaction a test added (faults); the realistic API serves everything again."""
        self._payloads[:] = [p for p in self._payloads if id(p) in self._own_payloads]

    def compact(self) -> None:
        """Forget watch history, as etcd compaction does: older resourceVersions get 410 Gone."""
        self._store.compact()

    @property
    def resource_version(self) -> int:
        return self._store.rv

    def count(
        self, group: str, plural: str, predicate: Callable[[dict[str, Any]], bool] | None = None
    ) -> int:
        """How many objects of a resource are stored (no copies; for benchmarks and polling).
        Without a predicate, O(1): a benchmark polling it must not cost the server time that
        grows with the objects it holds."""
        if predicate is None:
            return self._store.count((group, plural))
        return sum(1 for obj in self._store.items((group, plural)) if predicate(obj))

    def snapshot(self) -> dict[str, list[dict[str, Any]]]:
        """All stored objects as {'group/plural': [objects]} (a copy, for assertions/debugging)."""
        result: dict[str, list[dict[str, Any]]] = {}
        for gr, key in self._store.all_refs():
            obj = self._store.get(gr, key)
            if obj is not None:
                result.setdefault(f"{gr[0]}/{gr[1]}" if gr[0] else gr[1], []).append(
                    copy.deepcopy(obj)
                )
        return result


class EmulatorThread:
    """Serves a RealisticKubernetes on 127.0.0.1 from its own thread and event loop.

    The sync kubernetes client blocks its caller, so the server must not share the test's
    loop. ``call(coro_fn)`` runs a coroutine on the server's loop (for helpers with no API).
    """

    def __init__(self, port: int = 0, **options: Any) -> None:
        self._port = port
        self._options = options
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, name="kube-emulator", daemon=True)
        self._error: BaseException | None = None
        self.emulator: RealisticKubernetes | None = None
        self.url = ""

    def start(self) -> EmulatorThread:
        self._thread.start()
        self._ready.wait(30)
        if self._error is not None:
            raise RuntimeError("the Kubernetes emulator failed to start") from self._error
        return self

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._serve())
        except BaseException as exc:  # noqa: BLE001 - reported to the starting thread
            self._error = exc
            self._ready.set()

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        async with RealisticKubernetes(**self._options) as emulator:
            async with kmock.Server(emulator, port=self._port or None) as server:
                self.emulator = emulator
                self.url = str(server.url).rstrip("/")
                self._ready.set()
                await self._stop.wait()
                await emulator.close_streams()  # or the HTTP server waits for open watches

    def call(self, fn: Callable[[RealisticKubernetes], Awaitable[T] | T], timeout: float = 30) -> T:
        """Run ``fn(emulator)`` on the emulator's loop (awaiting it if it is a coroutine)."""

        async def runner() -> T:
            assert self.emulator is not None
            result = fn(self.emulator)
            return await result if isinstance(result, Awaitable) else result

        return asyncio.run_coroutine_threadsafe(runner(), self._loop).result(timeout)

    def stop(self) -> None:
        if self._stop is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop.set)
            self._thread.join(30)


def kubeconfig(url: str, namespace: str = "default") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "emulator",
        "clusters": [{"name": "emulator", "cluster": {"server": url}}],
        "users": [{"name": "tester", "user": {"token": "emulator-token"}}],
        "contexts": [
            {
                "name": "emulator",
                "context": {"cluster": "emulator", "user": "tester", "namespace": namespace},
            }
        ],
    }
