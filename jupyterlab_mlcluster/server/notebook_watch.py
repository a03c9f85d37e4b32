"""Following the users' Notebooks, and the events re-issued on them, into a NotebookFeed.

One thread per resource, each a list-then-watch loop: list and hand the items to the feed,
watch from the list's resourceVersion (bookmarks move it on), resume from the last one seen
when a connection drops or a watch request ends, list again after 410 Gone. Nothing here
touches the event loop; the feed publishes through the broadcaster's thread-safe call.

(`kubernetes.informer.SharedInformer` lists and watches too, but in client 37 it cannot list
custom objects (it reads `.items` of the dict a custom-object list returns), and its stop()
waits for a quiet watch to end by itself; stopping here shuts the open response down.)
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from notebook_controller.crd import GROUP, KIND, PLURAL, VERSION
from notebook_controller.objects import LABEL_MANAGED_BY, MANAGED_BY

from ..kubeconn import KubeConnection
from .notebook_feed import NotebookFeed
from .notebooks import OWNER_LABEL

log = logging.getLogger(__name__)

# (api client, namespace, query parameters) -> the raw urllib3 response of a list or watch.
Request = Callable[..., Any]
CONNECT_TIMEOUT = 10.0
LIST_TIMEOUT = 60.0
MAX_RETRY_DELAY = 60.0
MIN_WATCH_SECONDS = 1.0


class Gone(Exception):
    """410: the resourceVersion is too old to watch from; list again."""


def request_notebooks(api: Any, namespace: str, **params: Any) -> Any:
    """Notebooks spawned through this API (they carry the owner label)."""
    from kubernetes import client

    return client.CustomObjectsApi(api).list_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, label_selector=OWNER_LABEL, **params
    )


def request_notebook_events(api: Any, namespace: str, **params: Any) -> Any:
    """Events the notebook-controller re-issues on Notebooks (pod scheduling, image pulls...)."""
    from kubernetes import client

    return client.CoreV1Api(api).list_namespaced_event(
        namespace,
        field_selector=f"involvedObject.kind={KIND}",
        label_selector=f"{LABEL_MANAGED_BY}={MANAGED_BY}",
        **params,
    )


class ListWatch:
    """One resource's list-then-watch loop (run it in a thread of its own)."""

    def __init__(
        self,
        what: str,
        request: Request,
        connection: KubeConnection,
        on_list: Callable[[Iterable[Mapping[str, Any]]], None],
        on_change: Callable[[str, Mapping[str, Any]], None],
        stopping: threading.Event,
        watch_timeout: int = 300,
    ):
        self.what = what
        self.request = request
        self.connection = connection
        self.on_list = on_list
        self.on_change = on_change
        self.stopping = stopping
        self.watch_timeout = watch_timeout
        self._lock = threading.Lock()
        self._response: Any = None
        self.lists = 0  # how many times it listed (a relist after 410 counts)
        self._problem: str | None = None  # the API's last refusal, logged once

    def run(self) -> None:
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        api: Any = None
        resource_version: str | None = None
        delay = 1.0
        try:
            while not self.stopping.is_set():
                if self.connection.problem():
                    resource_version = None  # it may be another cluster when one comes back
                    self.stopping.wait(self.connection.PROBE_TTL)
                    continue
                try:
                    api = api or self.connection.new_api_client()
                    namespace = self.connection.namespace()
                    if resource_version is None:
                        resource_version = self._list(api, namespace)
                    started = time.monotonic()
                    resource_version = self._watch(api, namespace, resource_version)
                    if time.monotonic() - started > MIN_WATCH_SECONDS:
                        delay, self._problem = 1.0, None
                        continue
                    # A watch the server ends at once, again and again, must not spin.
                except Gone as exc:
                    log.info("mlcluster: listing %s again (%s)", self.what, exc)
                    resource_version = None
                    continue
                except ApiException as exc:
                    resource_version = None  # list again: the watch may have missed changes
                    if exc.status == 410:
                        continue
                    # e.g. 404 while the Notebook CRD is not installed, 403 without RBAC:
                    # said once, not every minute.
                    problem = f"{exc.status} {exc.reason}"
                    level = logging.DEBUG if problem == self._problem else logging.WARNING
                    log.log(level, "mlcluster: cannot follow %s: %s", self.what, problem)
                    self._problem = problem
                except (HTTPError, OSError, ValueError) as exc:
                    if self.stopping.is_set():
                        break
                    log.info("mlcluster: %s watch interrupted (%s); resuming", self.what, exc)
                except Exception:
                    # Whatever it was, the thread must not die: /events would go quiet for good.
                    log.exception("mlcluster: following %s failed; listing again", self.what)
                    resource_version = None
                self.stopping.wait(delay)
                delay = min(delay * 2, MAX_RETRY_DELAY)
        finally:
            if api is not None:
                api.close()

    def _list(self, api: Any, namespace: str) -> str:
        response = self.request(
            api, namespace, _preload_content=False, _request_timeout=(CONNECT_TIMEOUT, LIST_TIMEOUT)
        )
        listing = json.loads(response.data)
        self.lists += 1
        self.on_list(listing.get("items") or [])
        return str(listing["metadata"]["resourceVersion"])

    def _watch(self, api: Any, namespace: str, resource_version: str) -> str:
        """Changes from `resource_version` until the server ends the request; the last
        resourceVersion seen."""
        from kubernetes.client.exceptions import ApiException
        from kubernetes.watch.watch import iter_resp_lines

        response = self.request(
            api,
            namespace,
            watch=True,
            resource_version=resource_version,
            allow_watch_bookmarks=True,
            timeout_seconds=self.watch_timeout,
            _preload_content=False,
            # A connection that died silently shows as a read timeout past the server's own.
            _request_timeout=(CONNECT_TIMEOUT, self.watch_timeout + 30),
        )
        with self._lock:
            self._response = response
        try:
            if self.stopping.is_set():
                return resource_version  # stop() came before it could shut this one down
            for line in iter_resp_lines(response):
                if not line:
                    continue
                event = json.loads(line)
                kind, obj = event["type"], event["object"]
                if kind == "ERROR":
                    if obj.get("code") == 410:
                        raise Gone(obj.get("message") or "410 Gone")
                    raise ApiException(status=obj.get("code"), reason=obj.get("message"))
                resource_version = obj["metadata"].get("resourceVersion") or resource_version
                if kind != "BOOKMARK":
                    self.on_change(kind, obj)
        finally:
            with self._lock:
                self._response = None
            response.release_conn()
        return resource_version

    def interrupt(self) -> None:
        """Shut the open watch response down, so a blocked read returns at once."""
        with self._lock:
            response = self._response
        if response is not None:
            response.shutdown()


class NotebookWatch:
    """Keeps a NotebookFeed current from the cluster, in two daemon threads."""

    def __init__(self, connection: KubeConnection, feed: NotebookFeed, watch_timeout: int = 300):
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []
        self.events = ListWatch(
            "events on Notebooks",
            request_notebook_events,
            connection,
            feed.replace_events,
            feed.event_changed,
            self._stopping,
            watch_timeout,
        )
        self.notebooks = ListWatch(
            "Notebooks",
            request_notebooks,
            connection,
            self._notebooks_listed(feed),
            feed.notebook_changed,
            self._stopping,
            watch_timeout,
        )

    def _notebooks_listed(
        self, feed: NotebookFeed
    ) -> Callable[[Iterable[Mapping[str, Any]]], None]:
        def listed(items: Iterable[Mapping[str, Any]]) -> None:
            feed.replace_notebooks(items)
            # Events only count for notebooks the feed knows: follow them once it knows some.
            if len(self._threads) == 1:
                self._start(self.events)

        return listed

    def _start(self, follower: ListWatch) -> None:
        thread = threading.Thread(
            target=follower.run, name=f"mlcluster-watch-{len(self._threads)}", daemon=True
        )
        self._threads.append(thread)
        thread.start()

    def start(self) -> None:
        if not self._threads and not self._stopping.is_set():
            self._start(self.notebooks)

    def stop(self, timeout: float = 5.0) -> None:
        """Stop both threads (blocks up to `timeout`: call it off the event loop)."""
        self._stopping.set()
        for follower in (self.notebooks, self.events):
            follower.interrupt()
        for thread in list(self._threads):
            thread.join(timeout)
