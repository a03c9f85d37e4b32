"""What /events says about notebook servers: each Notebook's view, pushed to its owner when
it changes, with the latest pod event re-issued on it as spawn progress.

`NotebookFeed` only keeps state and decides what to say; `notebook_watch.py` feeds it from
the cluster (any thread) and `publish(owner, name, message)` delivers what it says.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ..notebook_resource import KIND
from .notebooks import is_spawning, notebook_view

Publish = Callable[[str, str, dict[str, Any]], None]
# (owner, namespace) -> whether that namespace is where the owner's notebooks live.
Belongs = Callable[[str, str], bool]
Key = tuple[str, str]  # (namespace, name): two users' namespaces may hold the same name


def _uid(obj: Mapping[str, Any]) -> str | None:
    return obj["metadata"].get("uid")


def _key(obj: Mapping[str, Any]) -> Key:
    return obj["metadata"].get("namespace") or "", obj["metadata"]["name"]


def event_time(event: Mapping[str, Any]) -> str:
    """When an event last happened (RFC 3339, comparable as text)."""
    return (
        event.get("lastTimestamp")
        or event.get("eventTime")
        or (event.get("metadata") or {}).get("creationTimestamp")
        or ""
    )


class NotebookFeed:
    """Thread-safe. Spawn progress is the newest event on a Notebook (by its uid, so a
    notebook re-made under the same name starts afresh) since it last began spawning: it is
    forgotten whenever the notebook is stopped, ready or failed.

    `belongs`, where given, must accept a Notebook's namespace for its owner before the owner
    hears of it: a Notebook someone made in their own namespace naming another user as its
    owner is shown to nobody."""

    def __init__(self, publish: Publish, belongs: Belongs | None = None):
        self._publish = publish
        self._belongs = belongs
        self._lock = threading.Lock()
        self._notebooks: dict[Key, dict[str, Any]] = {}
        self._progress: dict[str, dict[str, str]] = {}  # notebook uid -> {message, time}
        self._shown: dict[Key, tuple[str | None, dict[str, Any]]] = {}  # -> (owner, view)

    def progress(self, obj: Mapping[str, Any]) -> dict[str, str] | None:
        with self._lock:
            return self._progress.get(_uid(obj) or "")

    # -- Notebooks -----------------------------------------------------------------------

    def replace_notebooks(
        self, items: Iterable[Mapping[str, Any]], namespace: str | None = None
    ) -> None:
        """A fresh list (of every namespace, or of `namespace` only, when each namespace is
        watched on its own): what is no longer there was deleted while nobody watched."""
        items = list(items)
        with self._lock:
            present = {_key(obj) for obj in items}
            listed = [k for k in self._notebooks if namespace is None or k[0] == namespace]
            for key in [k for k in listed if k not in present]:
                self._remove(key)
            for obj in items:
                self._update(obj)
            kept = {_uid(obj) for obj in items}
            if namespace is not None:  # other namespaces' notebooks keep their progress
                kept |= {_uid(obj) for key, obj in self._notebooks.items() if key[0] != namespace}
            for uid in [u for u in self._progress if u not in kept]:
                del self._progress[uid]

    def notebook_changed(self, change: str, obj: Mapping[str, Any]) -> None:
        with self._lock:
            if change == "DELETED":
                self._remove(_key(obj))
            else:
                self._update(obj)

    def _update(self, obj: Mapping[str, Any]) -> None:
        key = _key(obj)
        old = self._notebooks.get(key)
        if old is not None and _uid(old) != _uid(obj):
            self._progress.pop(_uid(old) or "", None)
        self._notebooks[key] = dict(obj)
        if not is_spawning(obj):
            self._progress.pop(_uid(obj) or "", None)
        self._show(key)

    def _remove(self, key: Key) -> None:
        obj = self._notebooks.pop(key, None)
        if obj is not None:
            self._progress.pop(_uid(obj) or "", None)
        owner, _ = self._shown.pop(key, (None, None))
        if owner:
            name = key[1]
            self._publish(owner, name, {"type": "notebook_deleted", "name": name})

    def _show(self, key: Key) -> None:
        obj = self._notebooks[key]
        name = key[1]
        view = notebook_view(obj, self._progress.get(_uid(obj) or ""))
        owner = view.get("owner")
        if owner and self._belongs is not None and not self._belongs(owner, key[0]):
            owner = None  # not in the owner's namespace: nobody's to see
        previous = self._shown.get(key)
        if previous == (owner, view):
            return  # e.g. only kopf's bookkeeping annotations changed
        if previous is not None and previous[0] and previous[0] != owner:
            self._publish(previous[0], name, {"type": "notebook_deleted", "name": name})
        self._shown[key] = (owner, view)
        if owner:
            self._publish(owner, name, {"type": "notebook", "notebook": view})

    # -- events re-issued on Notebooks -----------------------------------------------------

    def replace_events(
        self, items: Iterable[Mapping[str, Any]], namespace: str | None = None
    ) -> None:
        """A fresh list of events (of every namespace, or of `namespace` only)."""
        with self._lock:
            keys = [k for k in self._notebooks if namespace is None or k[0] == namespace]
            if namespace is None:
                self._progress.clear()
            for key in keys:
                self._progress.pop(_uid(self._notebooks[key]) or "", None)
            for event in sorted(items, key=event_time):
                self._take(event)
            for key in keys:
                self._show(key)

    def event_changed(self, change: str, event: Mapping[str, Any]) -> None:
        if change == "DELETED":
            return  # an event expiring says nothing new about a notebook
        with self._lock:
            key = self._take(event)
            if key is not None:
                self._show(key)

    def _take(self, event: Mapping[str, Any]) -> Key | None:
        """Record an event as its notebook's progress; the notebook's key if it was."""
        involved = event.get("involvedObject") or {}
        namespace = involved.get("namespace") or (event.get("metadata") or {}).get("namespace")
        notebook = self._notebooks.get((namespace or "", involved.get("name") or ""))
        if (
            involved.get("kind") != KIND
            or notebook is None
            or _uid(notebook) != involved.get("uid")
            or not is_spawning(notebook)
        ):
            return None
        uid, when = involved["uid"], event_time(event)
        current = self._progress.get(uid)
        if current is not None and when < current["time"]:
            return None  # an older event, arriving late
        self._progress[uid] = {"message": event.get("message") or "", "time": when}
        return _key(notebook)
