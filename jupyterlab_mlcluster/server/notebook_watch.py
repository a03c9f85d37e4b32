"""Following the users' Notebooks, and the events re-issued on them, into a NotebookFeed.

One thread per resource, each `kubeconn.ListWatch`'s list-then-watch loop: list and hand the
items to the feed, watch from the list's resourceVersion (bookmarks move it on), resume from
the last one seen when a connection drops or a watch request ends, list again after 410 Gone;
failures wait the one backoff policy and are logged once with a count. Nothing here touches
the event loop; the feed publishes through the broadcaster's thread-safe call.

(`kubernetes.informer.SharedInformer` lists and watches too, but in client 37 it cannot list
custom objects (it reads `.items` of the dict a custom-object list returns), and its stop()
waits for a quiet watch to end by itself; stopping here shuts the open response down.)
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from .. import kubeconn
from ..kubeconn import KubeConnection
from ..notebook_resource import GROUP, KIND, LABEL_MANAGED_BY, MANAGED_BY, PLURAL, VERSION
from .notebook_feed import NotebookFeed
from .notebooks import OWNER_LABEL

log = logging.getLogger(__name__)

# (api client, namespace or None for all, query parameters) -> the raw urllib3 response of a
# list or watch.
Request = Callable[..., Any]
CONNECT_TIMEOUT = 10.0
LIST_TIMEOUT = 60.0
FAILURES = kubeconn.FailureLog(log)  # an outage is logged once, then counted


def request_notebooks(api: Any, namespace: str | None, **params: Any) -> Any:
    """Notebooks spawned through this API (they carry the owner label)."""
    from kubernetes import client

    custom = client.CustomObjectsApi(api)
    if namespace is None:
        return custom.list_cluster_custom_object(
            GROUP, VERSION, PLURAL, label_selector=OWNER_LABEL, **params
        )
    return custom.list_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, label_selector=OWNER_LABEL, **params
    )


def request_notebook_events(api: Any, namespace: str | None, **params: Any) -> Any:
    """Events the notebook-controller re-issues on Notebooks (pod scheduling, image pulls...)."""
    from kubernetes import client

    selectors: dict[str, Any] = {
        "field_selector": f"involvedObject.kind={KIND}",
        "label_selector": f"{LABEL_MANAGED_BY}={MANAGED_BY}",
    }
    core = client.CoreV1Api(api)
    if namespace is None:
        return core.list_event_for_all_namespaces(**selectors, **params)
    return core.list_namespaced_event(namespace, **selectors, **params)


class ListWatch(kubeconn.ListWatch):
    """One resource's list-then-watch loop (kubeconn's, with its backoff) over the server's
    re-probed connection and a typed-client request function."""

    def __init__(
        self,
        what: str,
        request: Request,
        connection: KubeConnection,
        on_list: Callable[[Iterable[Mapping[str, Any]]], None],
        on_change: Callable[[str, Mapping[str, Any]], None],
        stopping: threading.Event,
        watch_timeout: int = 300,
        all_namespaces: bool = False,
        namespace: str | None = None,
    ):
        super().__init__(
            what, on_list, on_change, stopping, watch_timeout=watch_timeout, failures=FAILURES
        )
        self.request = request
        self.connection = connection
        self.all_namespaces = all_namespaces
        self.namespace = namespace  # this one (watched alone), else as all_namespaces says
        self._api: Any = None

    def host(self) -> str:
        api = self._api
        return api.configuration.host if api is not None else "(unknown)"

    def _client(self) -> Any:
        problem = self.connection.problem()
        if problem:
            if self._api is not None:
                self._api.close()
                self._api = None
            raise kubeconn.ClusterUnavailable(problem)
        if self._api is None:
            self._api = self.connection.new_api_client()
        return self._api

    def _namespace(self) -> str | None:
        if self.namespace is not None:
            return self.namespace
        return None if self.all_namespaces else self.connection.namespace()

    def list_items(self) -> tuple[list[dict[str, Any]], str]:
        api = self._client()
        response = self.request(
            api,
            self._namespace(),
            _preload_content=False,
            _request_timeout=(CONNECT_TIMEOUT, LIST_TIMEOUT),
        )
        listing = json.loads(response.data)
        return listing.get("items") or [], str(listing["metadata"]["resourceVersion"])

    def open_watch(self, resource_version: str) -> Any:
        return self.request(
            self._client(),
            self._namespace(),
            watch=True,
            resource_version=resource_version,
            allow_watch_bookmarks=True,
            timeout_seconds=self.watch_timeout,
            _preload_content=False,
            # A connection that died silently shows as a read timeout past the server's own.
            _request_timeout=(CONNECT_TIMEOUT, self.watch_timeout + 30),
        )

    def closed(self) -> None:
        if self._api is not None:
            self._api.close()
            self._api = None


class NotebookWatch:
    """Keeps a NotebookFeed current from the cluster, in daemon threads: the connection's
    namespace, every namespace (`all_namespaces`: each user's notebooks in their own; the
    feed tells each owner only of notebooks in the owner's namespace), or each of the user
    namespaces given (`namespaces`: one list-watch of Notebooks and one of their events per
    namespace, so the server needs those reads only there, not cluster-wide)."""

    def __init__(
        self,
        connection: KubeConnection,
        feed: NotebookFeed,
        watch_timeout: int = 300,
        all_namespaces: bool = False,
        namespaces: Iterable[str] = (),
    ):
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        # (notebooks, events) per namespace watched on its own; one pair otherwise.
        self.pairs: list[tuple[ListWatch, ListWatch]] = []
        watched: list[str | None] = [*namespaces] or [None]
        for namespace in watched:
            events = ListWatch(
                "events on Notebooks" + (f" in {namespace}" if namespace else ""),
                request_notebook_events,
                connection,
                self._in(feed.replace_events, namespace),
                feed.event_changed,
                self._stopping,
                watch_timeout,
                all_namespaces,
                namespace,
            )
            notebooks = ListWatch(
                "Notebooks" + (f" in {namespace}" if namespace else ""),
                request_notebooks,
                connection,
                self._notebooks_listed(feed, namespace, events),
                feed.notebook_changed,
                self._stopping,
                watch_timeout,
                all_namespaces,
                namespace,
            )
            self.pairs.append((notebooks, events))
        # The whole-cluster (or connection's namespace) pair, as before.
        self.notebooks, self.events = self.pairs[0]

    @staticmethod
    def _in(
        replace: Callable[..., None], namespace: str | None
    ) -> Callable[[Iterable[Mapping[str, Any]]], None]:
        return lambda items: replace(items, namespace) if namespace else replace(items)

    def _notebooks_listed(
        self, feed: NotebookFeed, namespace: str | None, events: ListWatch
    ) -> Callable[[Iterable[Mapping[str, Any]]], None]:
        started = threading.Event()

        def listed(items: Iterable[Mapping[str, Any]]) -> None:
            if namespace:
                feed.replace_notebooks(items, namespace)
            else:
                feed.replace_notebooks(items)
            # Events only count for notebooks the feed knows: follow them once it knows some.
            if not started.is_set():
                started.set()
                self._start(events)

        return listed

    def _start(self, follower: ListWatch) -> None:
        with self._lock:
            if self._stopping.is_set():
                return
            thread = threading.Thread(
                target=follower.run, name=f"mlcluster-watch-{len(self._threads)}", daemon=True
            )
            self._threads.append(thread)
        thread.start()

    def start(self) -> None:
        if not self._threads and not self._stopping.is_set():
            for notebooks, _events in self.pairs:
                self._start(notebooks)

    def stop(self, timeout: float = 5.0) -> None:
        """Stop every thread (blocks up to `timeout` each: call it off the event loop)."""
        self._stopping.set()
        for pair in self.pairs:
            for follower in pair:
                follower.interrupt()
        with self._lock:
            threads = list(self._threads)
        for thread in threads:
            thread.join(timeout)
