"""The event stream: one store watcher per server, fanned out to every websocket client.

A single thread follows the store's change feed (cheap: one PRAGMA when nothing changed),
loads what changed, encodes each message once, and hands it to the event loop, which
offers it to every subscriber. Subscribers keep only the newest message per subject
(a job, its logs, the cluster), so a slow client gets fewer, fresher messages instead
of an ever-growing backlog; and nothing on the event loop touches SQLite or files.

Notebook servers come from another source (`notebook_watch.py`, through `publish_to_user`),
and each message about one goes only to the websockets of its owner.

On a server shared by several users (identity from the trusted header) each websocket has a
`scope`, its caller: it hears only of that user's jobs (snapshot, changes, deletions, log
notices) and sees only their ids in the cluster's queue. Every message carries a target
saying who may receive it; the watcher keeps each job's owner for that.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from jupyter_server.auth.decorator import authorized, ws_authenticated
from jupyter_server.base.handlers import JupyterHandler
from jupyter_server.base.websocket import WebSocketMixin
from tornado import web
from tornado.websocket import WebSocketClosedError, WebSocketHandler

from ..jobs.storage.store import UnknownJob
from ..jobs.storage.watch import StoreWatcher
from .identity import IdentityError

if TYPE_CHECKING:
    from ..jobs.service import JobService

Key = tuple[str, str]
# Who receives a message: EVERYONE; ("job", owner): whoever may see that owner's jobs;
# ("scope", scope): the subscribers of exactly that scope (None: the unscoped ones).
Target = tuple[str, Any]
EVERYONE: Target = ("all", None)
log = logging.getLogger(__name__)


class Subscriber:
    """One consumer of events: the newest pending message per subject, in arrival order.
    `user` is whose notebook servers it hears about (None: nobody's); `scope` whose jobs it
    hears about (None: everyone's, on a personal server)."""

    def __init__(
        self, send: Callable[[str], Any], user: str | None = None, scope: str | None = None
    ):
        self._send = send
        self.user = user
        self.scope = scope
        self._pending: OrderedDict[Key, str] = OrderedDict()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.closed = False

    def offer(self, key: Key, text: str) -> None:
        if self.closed:
            return
        if key[0] == "snapshot":
            self._pending.clear()
        elif key[0] == "deleted":
            self._pending.pop(("job", key[1]), None)
            self._pending.pop(("logs", key[1]), None)
        self._pending.pop(key, None)  # re-queue at the end: order follows the latest change
        self._pending[key] = text
        self._wake.set()

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._pump())

    async def _pump(self) -> None:
        try:
            while not self.closed:
                await self._wake.wait()
                self._wake.clear()
                while self._pending and not self.closed:
                    _key, text = self._pending.popitem(last=False)
                    await self._send(text)  # waits for the client: backpressure
        except (WebSocketClosedError, asyncio.CancelledError):
            pass
        finally:
            self.closed = True

    def close(self) -> None:
        self.closed = True
        self._pending.clear()
        self._wake.set()

    def receives(self, target: Target) -> bool:
        kind, who = target
        if kind == "all":
            return True
        if kind == "job":
            return self.scope is None or self.scope == who
        return self.scope == who


class EventBroadcaster:
    """Follows the job store in one thread and publishes changes on the event loop."""

    def __init__(
        self,
        service: JobService,
        *,
        poll_interval: float = 0.05,
        max_rate: float = 10.0,
        snapshot_limit: int = 200,
        cluster_interval: float = 0.5,
    ):
        self.service = service
        self.poll_interval = poll_interval
        self.min_gap = 1.0 / max_rate if max_rate > 0 else 0.0
        self.snapshot_limit = snapshot_limit
        self.cluster_interval = cluster_interval
        self._subscribers: set[Subscriber] = set()
        # The scopes of the current subscribers, read by the watcher thread (a copy is
        # swapped in on each change, so it never sees one half-updated).
        self._scopes: frozenset[str | None] = frozenset()
        self._job_waiters: dict[str, set[asyncio.Event]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._seq = itertools.count(1)

    @property
    def scopes(self) -> frozenset[str | None]:
        """The scopes the subscribers see (None: everything)."""
        return self._scopes

    def encode(self, message: dict[str, Any]) -> str:
        """JSON with a `seq` that grows with the time a message was made (any thread), so a
        client can drop a message older than one it already applied (e.g. the snapshot)."""
        return json.dumps({**message, "seq": next(self._seq)})

    # -- lifecycle (event loop) ---------------------------------------------------------

    def ensure_started(self) -> None:
        """Start the watcher thread (once), publishing to the running event loop."""
        if self._thread is None and not self._stop.is_set():
            self._loop = asyncio.get_running_loop()
            self._thread = threading.Thread(target=self._run, name="mlcluster-events", daemon=True)
            self._thread.start()

    async def stop(self) -> None:
        self._stop.set()
        for subscriber in list(self._subscribers):
            subscriber.close()
        self._subscribers.clear()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, 10.0)

    # -- subscribers (event loop) -------------------------------------------------------

    def subscribe(self, subscriber: Subscriber) -> None:
        self.ensure_started()
        self._subscribers.add(subscriber)
        self._scopes = frozenset(s.scope for s in self._subscribers)

    def unsubscribe(self, subscriber: Subscriber) -> None:
        self._subscribers.discard(subscriber)
        self._scopes = frozenset(s.scope for s in self._subscribers)
        subscriber.close()

    def job_changed(self, job_id: str) -> _JobWaiter:
        """`with broadcaster.job_changed(id) as changed: await changed.wait()` wakes on any
        change of that job (state, ranks, new log lines); used to follow logs without polling."""
        return _JobWaiter(self, job_id)

    def publish_to_user(self, user: str, name: str, message: dict[str, Any]) -> None:
        """Any thread: a message about the notebook server `name`, for `user`'s subscribers
        only. Messages about one notebook replace each other while they wait to be sent."""
        self._call_soon(self._publish_to_user, user, ("notebook", name), self.encode(message))

    def _publish_to_user(self, user: str, key: Key, text: str) -> None:
        for subscriber in list(self._subscribers):
            if subscriber.user == user:
                subscriber.offer(key, text)

    def _publish(self, messages: list[tuple[Key, str, Target]], touched: set[str]) -> None:
        for job_id in touched:
            for event in self._job_waiters.get(job_id, ()):
                event.set()
        for key, text, target in messages:
            for subscriber in list(self._subscribers):
                if subscriber.receives(target):
                    subscriber.offer(key, text)

    # -- snapshot (any thread) ----------------------------------------------------------

    def snapshot(self, scope: str | None = None) -> dict[str, Any]:
        """Recent jobs (the newest `snapshot_limit`, plus every unfinished one) and the
        cluster; `scope`: only that user's jobs."""
        recent, total = self.service.list(owner=scope, limit=self.snapshot_limit)
        active, _ = self.service.list(owner=scope, states=["queued", "starting", "running"])
        seen = {job.id for job in recent}
        jobs = recent + [job for job in active if job.id not in seen]
        return {
            "type": "snapshot",
            "jobs": [job.to_json() for job in jobs],
            "total": total,
            "cluster": self.service.cluster(owner=scope),
        }

    # -- the watcher thread -------------------------------------------------------------

    def _run(self) -> None:
        feed = _StoreFeed(self)
        try:
            while not self._stop.is_set():
                try:
                    messages, touched = feed.turn(time.monotonic())
                    if messages or touched:
                        self._call_soon(self._publish, messages, touched)
                    self.service.reap()  # settle jobs whose supervisors died (self-throttled)
                except Exception:
                    log.exception("mlcluster event watcher")
                    self._stop.wait(1.0)
                self._stop.wait(self.poll_interval)
        finally:
            self.service.store.close()

    def _call_soon(self, fn: Callable[..., Any], *args: Any) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(fn, *args)
            except RuntimeError:  # loop closed between the check and the call
                pass


class _StoreFeed:
    """What the store's changes become, turn by turn: the messages to publish, each with its
    target. It remembers what it has said (job states, owners, each scope's cluster) so a
    change is said once and a cluster summary only when it differs."""

    def __init__(self, broadcaster: EventBroadcaster):
        self.broadcaster = broadcaster
        self.store = broadcaster.service.store
        self.watcher = StoreWatcher(self.store)
        self.due = _Coalescer(broadcaster.min_gap)
        self.states: dict[str, str] = {}
        self.owners: dict[str, str | None] = self.store.job_owners()
        self.last_cluster: dict[str | None, str] = {}
        self.cluster_stale, self.cluster_quiet_until = True, 0.0

    def turn(self, now: float) -> tuple[list[tuple[Key, str, Target]], set[str]]:
        """One poll of the store: the messages it calls for, and the jobs it touched."""
        changes = self.watcher.poll()
        messages: list[tuple[Key, str, Target]] = []
        if changes.resync:
            self._resync(messages)
        for job_id in changes.deleted:
            self._deleted(job_id, messages)
        for job_id in changes.jobs:
            self.due.changed(("job", job_id))
        for job_id in changes.logs:
            self.due.changed(("logs", job_id))
        for key in self.due.due(now):
            self._changed(key, messages)
        if self.cluster_stale and now >= self.cluster_quiet_until:
            # At most every cluster_interval, however busy the store is.
            self.cluster_stale = False
            self.cluster_quiet_until = now + self.broadcaster.cluster_interval
            self._cluster(messages)
        return messages, changes.jobs | changes.logs | changes.deleted

    def _resync(self, messages: list[tuple[Key, str, Target]]) -> None:
        self.owners = self.store.job_owners()
        for scope in self.broadcaster.scopes:
            text = self.broadcaster.encode(self.broadcaster.snapshot(scope))
            messages.append((("snapshot", ""), text, ("scope", scope)))
        self.due.clear()
        self.cluster_stale = True

    def _deleted(self, job_id: str, messages: list[tuple[Key, str, Target]]) -> None:
        self.due.forget(job_id)
        self.states.pop(job_id, None)
        # An owner never learned (created and purged unseen): unscoped only.
        owners = self.owners
        target = ("job", owners.pop(job_id)) if job_id in owners else ("scope", None)
        text = self.broadcaster.encode({"type": "deleted", "id": job_id})
        messages.append((("deleted", job_id), text, target))
        self.cluster_stale = True

    def _changed(self, key: Key, messages: list[tuple[Key, str, Target]]) -> None:
        kind, job_id = key
        if kind == "logs":
            if job_id not in self.owners:
                self.owners.update(self.store.job_owners([job_id]))
            if job_id in self.owners:
                text = self.broadcaster.encode({"type": "logs", "id": job_id})
                messages.append((key, text, ("job", self.owners[job_id])))
            return
        try:
            record = self.store.get_job(job_id)
        except UnknownJob:
            return  # deleted meanwhile; its "deleted" event follows
        self.owners[job_id] = record.owner
        if self.states.get(job_id) != record.state.value:
            self.states[job_id] = record.state.value
            self.cluster_stale = True  # capacity and queue change with job states
        text = self.broadcaster.encode({"type": "job", "job": record.to_json()})
        messages.append((key, text, ("job", record.owner)))

    def _cluster(self, messages: list[tuple[Key, str, Target]]) -> None:
        for scope in self.broadcaster.scopes | {None}:
            cluster = self.broadcaster.service.cluster(owner=scope)
            text = json.dumps(cluster)
            if text != self.last_cluster.get(scope, text):
                message = self.broadcaster.encode({"type": "cluster", "cluster": cluster})
                messages.append((("cluster", ""), message, ("scope", scope)))
            self.last_cluster[scope] = text


class _Coalescer:
    """At most one message per subject per `min_gap` seconds; later changes wait their turn."""

    def __init__(self, min_gap: float):
        self.min_gap = min_gap
        self._last: dict[Key, float] = {}
        self._waiting: set[Key] = set()

    def changed(self, key: Key) -> None:
        self._waiting.add(key)

    def due(self, now: float) -> Iterator[Key]:
        for key in list(self._waiting):
            if now - self._last.get(key, -1e9) >= self.min_gap:
                self._waiting.discard(key)
                self._last[key] = now
                yield key

    def forget(self, job_id: str) -> None:
        for kind in ("job", "logs"):
            self._waiting.discard((kind, job_id))
            self._last.pop((kind, job_id), None)

    def clear(self) -> None:
        self._waiting.clear()


class _JobWaiter:
    def __init__(self, broadcaster: EventBroadcaster, job_id: str):
        self._broadcaster = broadcaster
        self._job_id = job_id
        self.event = asyncio.Event()

    def __enter__(self) -> asyncio.Event:
        self._broadcaster.ensure_started()
        self._broadcaster._job_waiters.setdefault(self._job_id, set()).add(self.event)
        return self.event

    def __exit__(self, *exc: object) -> None:
        waiters = self._broadcaster._job_waiters.get(self._job_id)
        if waiters is not None:
            waiters.discard(self.event)
            if not waiters:
                del self._broadcaster._job_waiters[self._job_id]


class EventsHandler(WebSocketMixin, WebSocketHandler, JupyterHandler):
    """`GET /mlcluster/api/events`: authenticated like the kernel websocket (token or
    cookie, origin check from WebSocketMixin), then a snapshot and live changes."""

    auth_resource = "mlcluster"
    subscriber: Subscriber | None = None

    def set_default_headers(self) -> None:
        """JupyterHandler's HTTP headers (CSP etc.) do not apply to a websocket."""

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        # Refusals before the upgrade are plain HTTP: answer JSON like the REST API.
        exc = kwargs.get("exc_info", (None, None, None))[1]
        message = getattr(exc, "log_message", None) or self._reason
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps({"message": message}))

    @ws_authenticated
    @authorized("read")
    # (the override is WebSocketHandler.get's own signature; mypy sees it through
    # jupyter_server's decorators, whose annotations lose it)
    async def get(self, *args: Any, **kwargs: Any) -> None:  # type: ignore[override]
        app = self.settings["mlcluster"]
        try:
            self.user: str | None = app.user_identity(self.current_user, self.request.headers)
        except IdentityError as exc:
            if app.trust_identity_header:  # a shared server: no identity, nothing to see
                raise web.HTTPError(403, str(exc)) from None
            self.user = None  # jobs only: without an identity, no notebook servers are its own
        if self.request.headers.get("Upgrade", "").lower() != "websocket":
            raise web.HTTPError(
                426, "this is a websocket endpoint: connect with a websocket client"
            )
        await super().get(*args, **kwargs)

    async def open(self, *args: Any, **kwargs: Any) -> None:
        super().open()  # WebSocketMixin: keep-alive pings
        app = self.settings["mlcluster"]
        scope = self.user if app.trust_identity_header else None
        subscriber = Subscriber(self.write_message, self.user, scope)
        self.subscriber = subscriber
        # Subscribe before taking the snapshot, so no change falls between the two.
        app.broadcaster.subscribe(subscriber)
        try:
            snapshot = await app.run(
                lambda: app.broadcaster.encode(app.broadcaster.snapshot(scope))
            )
            await self.write_message(snapshot)
        except WebSocketClosedError:
            app.broadcaster.unsubscribe(subscriber)
            return
        subscriber.start()

    def on_message(self, message: str | bytes) -> None:
        """Clients have nothing to say; everything comes from the server."""

    def on_close(self) -> None:
        if self.subscriber is not None:
            self.settings["mlcluster"].broadcaster.unsubscribe(self.subscriber)
