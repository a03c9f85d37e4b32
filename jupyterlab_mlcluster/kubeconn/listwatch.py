"""The one list-then-watch loop (`ListWatch`), over a blocking `Connection` in
`ConnectionListWatch`."""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from ..jobs.backoff import Backoff
from .blocking import Connection
from .errors import NO_CLUSTER, ClusterUnavailable, KubeError, as_kube_error, refused
from .retry import FailureLog, backoff_from_env

log = logging.getLogger("jupyterlab_mlcluster.kubernetes")


class Gone(Exception):
    """410: the resourceVersion is too old to watch from; list again."""


class ListWatch:
    """One resource's list-then-watch loop (run `run` in a thread of its own): list and hand
    the items to `on_list`, watch from the list's resourceVersion (bookmarks move it on) and
    hand each change to `on_change(type, obj)`, resume from the last resourceVersion seen
    when a connection drops or a watch request ends, list again after 410 Gone or a refusal.

    Every failure waits the one backoff policy (a watch that ends at once counts as one: it
    never spins), is logged once with a count (`FailureLog`) and goes to `on_error`. A
    subclass says how to list (`list_items`) and open a watch (`open_watch`)."""

    MIN_WATCH_SECONDS = 1.0  # a watch shorter than this ended "at once"
    NOT_CONFIGURED_DELAY = 10.0  # no cluster is configured: look again this often

    def __init__(
        self,
        what: str,
        on_list: Callable[[list[dict[str, Any]]], Any],
        on_change: Callable[[str, dict[str, Any]], Any],
        stopping: threading.Event,
        *,
        watch_timeout: int = 300,
        policy: Backoff | None = None,
        failures: FailureLog | None = None,
        on_error: Callable[[BaseException], Any] | None = None,
    ):
        self.what = what
        self.on_list = on_list
        self.on_change = on_change
        self.stopping = stopping
        self.watch_timeout = watch_timeout
        self.policy = policy or backoff_from_env()
        self.failures = failures or FailureLog(log)
        self.on_error = on_error
        self.lists = 0  # how many times it listed (a relist after 410 counts)
        self.failed = 0  # failures so far (tests and figures)
        self._lock = threading.Lock()
        self._response: Any = None

    # what a subclass provides
    def list_items(self) -> tuple[list[dict[str, Any]], str]:
        """(items, the list's resourceVersion); raise to fail."""
        raise NotImplementedError

    def open_watch(self, resource_version: str) -> Any:
        """The open streaming response (urllib3) of a watch from `resource_version`."""
        raise NotImplementedError

    def host(self) -> str:
        return "(unknown)"

    def closed(self) -> None:
        """The loop ended: release what it held."""

    def run(self) -> None:
        resource_version: str | None = None
        attempt = 0
        try:
            while not self.stopping.is_set():
                retry_after = None
                try:
                    if resource_version is None:
                        items, resource_version = self.list_items()
                        self.lists += 1
                        self.on_list(items)
                    started = time.monotonic()
                    resource_version = self._watch(resource_version)
                    if time.monotonic() - started > self.MIN_WATCH_SECONDS:
                        if attempt:
                            self.failures.recovered(f"following {self.what}")
                        attempt = 0
                        continue
                    # A watch the server ends at once, again and again, must not spin.
                except Gone as exc:
                    log.info("listing %s again (%s)", self.what, exc)
                    resource_version = None
                except Exception as exc:  # noqa: BLE001 - whatever it was, the loop goes on
                    if self.stopping.is_set():
                        break
                    error = as_kube_error(exc, self.host())
                    if isinstance(error, KubeError) and error.status is not None:
                        resource_version = None  # refused: the watch may have missed changes
                    if isinstance(error, ClusterUnavailable) and str(error).startswith(NO_CLUSTER):
                        resource_version = None  # it may be another cluster when one comes
                        self.failures.failed(f"following {self.what}", error, logging.DEBUG)
                        self.stopping.wait(self.NOT_CONFIGURED_DELAY)
                        continue
                    self.failed += 1
                    retry_after = getattr(error, "retry_after", None)
                    self.failures.failed(f"following {self.what}", error)
                    if self.on_error is not None:
                        self.on_error(error)
                self.stopping.wait(self.policy.delay(attempt, retry_after))
                attempt += 1
        finally:
            self.closed()

    def _watch(self, resource_version: str) -> str:
        """Changes from `resource_version` until the server ends the request; the last
        resourceVersion seen."""
        from kubernetes.watch.watch import iter_resp_lines

        response = self.open_watch(resource_version)
        with self._lock:
            self._response = response
        try:
            if self.stopping.is_set():
                return resource_version  # stop came before it could shut this one down
            for line in iter_resp_lines(response):
                if not line:
                    continue
                event = json.loads(line)
                kind, obj = event["type"], event["object"]
                if kind == "ERROR":
                    if obj.get("code") == 410:
                        raise Gone(obj.get("message") or "410 Gone")
                    raise refused(int(obj.get("code") or 500), obj)
                resource_version = obj["metadata"].get("resourceVersion") or resource_version
                if kind != "BOOKMARK":
                    self.on_change(kind, obj)
        finally:
            with self._lock:
                self._response = None
            with contextlib.suppress(Exception):
                response.release_conn()
        return resource_version

    def interrupt(self) -> None:
        """Shut the open watch response down, so a blocked read returns at once."""
        with self._lock:
            response = self._response
        if response is not None:
            shutdown_response(response)


def shutdown_response(response: Any) -> None:
    """Unblock a thread reading a streaming urllib3 response (its socket is shut down)."""
    shutdown = getattr(response, "shutdown", None)
    if shutdown is not None:
        with contextlib.suppress(Exception):
            shutdown()
            return
    import socket

    sock = getattr(getattr(response, "connection", None), "sock", None)
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)


class ConnectionListWatch(ListWatch):
    """A ListWatch of one collection path over a blocking `Connection`."""

    def __init__(self, conn: Connection, path: str, query: dict[str, Any], *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.conn = conn
        self.path = path
        self.query = query

    def host(self) -> str:
        return self.conn.host

    def list_items(self) -> tuple[list[dict[str, Any]], str]:
        listing = self.conn.request("GET", self.path, query=self.query)
        return listing.get("items") or [], str(listing["metadata"]["resourceVersion"])

    def open_watch(self, resource_version: str) -> Any:
        query = {
            **self.query,
            "watch": True,
            "resourceVersion": resource_version,
            "allowWatchBookmarks": True,
            "timeoutSeconds": self.watch_timeout,
        }
        # A connection that died silently shows as a read timeout past the server's own.
        timeout = (self.conn.request_timeout, self.watch_timeout + 30)
        return self.conn.request("GET", self.path, query=query, stream=True, timeout=timeout)
