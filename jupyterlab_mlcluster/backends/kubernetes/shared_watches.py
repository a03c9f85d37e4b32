"""What the jobs of one fleet (jobs/running/fleet.py) share in the cluster: one connection
per namespace, and one list-watch per namespace and kind (the jobs' objects of one kind, or
their pods) selected by the job-id label every object of ours carries, each change handed
to the job it belongs to: an informer, as a controller holds thousands of objects.

A job's attempt subscribes with its event queue (supervise_watches.AttemptWatches) and gets
what its own two watches would have put there: the job's objects known so far, then each
change, and ("watch_error", what, exc) when the shared
watch fails (it reconnects with the one backoff policy). So a thousand waiting jobs cost two
watches on the API, not two thousand, and no thread each.
"""

from __future__ import annotations

import logging
import queue
import threading
from typing import Any

from ... import kubeconn
from .client import Connection, Kind, connect, kind_of
from .labels import LABEL_JOB_ID

log = logging.getLogger("jupyterlab_mlcluster.supervisor")
FAILURES = kubeconn.FailureLog(log)
Event = tuple[Any, ...]
POOL_SIZE = 256  # API calls of many jobs at once (log streams are not on this pool)
# ... of which at most this many at once: a new fleet adopting 1,000 jobs sent a thousand
# calls together, the API server queued them past their timeout, and 208 jobs failed
# (bench_k8s_fleet --kill9). The rest wait their turn in the fleet, as client-go's
# rate limiter makes a controller's calls wait.
MAX_IN_FLIGHT = 16


class _ListWatch(kubeconn.ConnectionListWatch):
    """kubeconn's list-watch, saying when each list is asked for (`on_list_start`)."""

    def __init__(self, *args: Any, on_list_start: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.on_list_start = on_list_start

    def list_items(self) -> tuple[list[dict[str, Any]], str]:
        self.on_list_start()
        return super().list_items()


class _SharedSource:
    """One list-watch (a kind in a namespace, every job's), its objects by job label, and
    the queues subscribed to each job's share.

    A job subscribes after it made its objects, and the shared watch may not have seen them
    yet. So a subscriber gets what is known as changes ("job", obj), never as a list that
    would replace its view; a list replaces it ("job_list", ...) only when that list was
    asked for after the subscription (epochs count the lists asked for): only then does an
    object missing from it mean the object is gone."""

    def __init__(self, conn: Connection, namespace: str, kind: Kind, what: str):
        self.what = what
        self.lock = threading.Lock()
        self.epoch = 0  # lists asked for so far
        self.objects: dict[str, dict[str, dict[str, Any]]] = {}  # job label -> name -> obj
        # job label -> [(the queue, the epoch it subscribed in)]
        self.subscribers: dict[str, list[tuple[queue.Queue[Event], int]]] = {}
        self.stopping = threading.Event()
        self.watch = _ListWatch(
            conn,
            kind.path(namespace),
            {"labelSelector": LABEL_JOB_ID},
            f"the jobs' {what}s in {namespace}",
            self._listed,
            self._changed,
            self.stopping,
            failures=FAILURES,
            on_error=self._failed,
            on_list_start=self._list_started,
        )
        self.thread = threading.Thread(target=self.watch.run, name=f"watch-{what}s", daemon=True)
        self.thread.start()

    @staticmethod
    def _slim(obj: dict[str, Any]) -> dict[str, Any]:
        """Without the field managers' bookkeeping (often most of a real object's bytes;
        nothing here reads it): a thousand jobs' objects are held at once."""
        (obj.get("metadata") or {}).pop("managedFields", None)
        return obj

    @staticmethod
    def _label(obj: dict[str, Any]) -> str:
        return ((obj.get("metadata") or {}).get("labels") or {}).get(LABEL_JOB_ID, "")

    def _list_started(self) -> None:
        with self.lock:
            self.epoch += 1

    def _listed(self, items: list[dict[str, Any]]) -> None:
        by_job: dict[str, dict[str, dict[str, Any]]] = {}
        for obj in map(self._slim, items):
            by_job.setdefault(self._label(obj), {})[obj["metadata"]["name"]] = obj
        with self.lock:
            self.objects = by_job
            for label, queues in self.subscribers.items():
                share = list(by_job.get(label, {}).values())
                for events, since in queues:
                    if since < self.epoch:  # asked for after it subscribed: the whole truth
                        events.put((f"{self.what}_list", share))
                    else:
                        for obj in share:
                            events.put((self.what, obj))

    def _changed(self, change: str, obj: dict[str, Any]) -> None:
        label, name = self._label(self._slim(obj)), obj["metadata"]["name"]
        deleted = change == "DELETED"
        with self.lock:
            held = self.objects.setdefault(label, {})
            if deleted:
                held.pop(name, None)
                if not held:
                    del self.objects[label]
            else:
                held[name] = obj
            event = (f"{self.what}_deleted" if deleted else self.what, obj)
            for events, _ in self.subscribers.get(label, ()):
                events.put(event)

    def _failed(self, exc: BaseException) -> None:
        with self.lock:
            for queues in self.subscribers.values():
                for events, _ in queues:
                    events.put(("watch_error", self.what, exc))

    def subscribe(self, label: str, events: queue.Queue[Event]) -> None:
        with self.lock:
            self.subscribers.setdefault(label, []).append((events, self.epoch))
            for obj in self.objects.get(label, {}).values():
                events.put((self.what, obj))

    def unsubscribe(self, label: str, events: queue.Queue[Event]) -> None:
        with self.lock:
            queues = [q for q in self.subscribers.get(label, []) if q[0] is not events]
            if queues:
                self.subscribers[label] = queues
            else:
                self.subscribers.pop(label, None)


class SharedCluster:
    """One process's connections and shared watches (made on first use, kept for the
    process's life: a fleet's jobs come and go)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._connections: dict[tuple[str, float], Connection] = {}
        self._in_flight = threading.BoundedSemaphore(MAX_IN_FLIGHT)  # (all of them together)
        self._sources: dict[tuple[str, str, str], _SharedSource] = {}

    def connection(self, namespace: str, request_timeout: float) -> Connection:
        with self._lock:
            conn = self._connections.get((namespace, request_timeout))
            if conn is None:
                conn = connect(
                    namespace=namespace,
                    request_timeout=request_timeout,
                    pool_size=POOL_SIZE,
                    probe=False,
                )
                conn.in_flight = self._in_flight
                self._connections[(namespace, request_timeout)] = conn
            return conn

    def source(self, conn: Connection, namespace: str, kind: Kind, what: str) -> _SharedSource:
        key = (conn.host, namespace, kind.path(namespace))
        with self._lock:
            source = self._sources.get(key)
            if source is None:
                source = self._sources[key] = _SharedSource(conn, namespace, kind, what)
            return source

    def pods(self, conn: Connection, namespace: str) -> _SharedSource:
        return self.source(conn, namespace, kind_of("v1", "Pod"), "pod")


SHARED = SharedCluster()
