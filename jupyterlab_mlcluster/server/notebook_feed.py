"""What /events says about notebook servers: each Notebook's view, pushed to its owner when
it changes, with the latest pod event re-issued on it as spawn progress.

`NotebookFeed` only keeps state and decides what to say; `notebook_watch.py` feeds it from
the cluster (any thread) and `publish(owner, name, message)` delivers what it says.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from notebook_controller.crd import KIND

from .notebooks import is_spawning, notebook_view

Publish = Callable[[str, str, dict[str, Any]], None]


def _uid(obj: Mapping[str, Any]) -> str | None:
    return obj["metadata"].get("uid")


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
    forgotten whenever the notebook is stopped, ready or failed."""

    def __init__(self, publish: Publish):
        self._publish = publish
        self._lock = threading.Lock()
        self._notebooks: dict[str, dict[str, Any]] = {}
        self._progress: dict[str, dict[str, str]] = {}  # notebook uid -> {message, time}
        self._shown: dict[str, tuple[str | None, dict[str, Any]]] = {}  # name -> (owner, view)

    def progress(self, obj: Mapping[str, Any]) -> dict[str, str] | None:
        with self._lock:
            return self._progress.get(_uid(obj) or "")

    # -- Notebooks -----------------------------------------------------------------------

    def replace_notebooks(self, items: Iterable[Mapping[str, Any]]) -> None:
        """A fresh list: what is no longer there was deleted while nobody watched."""
        items = list(items)
        with self._lock:
            present = {obj["metadata"]["name"] for obj in items}
            for name in [n for n in self._notebooks if n not in present]:
                self._remove(name)
            for obj in items:
                self._update(obj)
            uids = {_uid(obj) for obj in items}
            for uid in [u for u in self._progress if u not in uids]:
                del self._progress[uid]

    def notebook_changed(self, change: str, obj: Mapping[str, Any]) -> None:
        with self._lock:
            if change == "DELETED":
                self._remove(obj["metadata"]["name"])
            else:
                self._update(obj)

    def _update(self, obj: Mapping[str, Any]) -> None:
        name = obj["metadata"]["name"]
        old = self._notebooks.get(name)
        if old is not None and _uid(old) != _uid(obj):
            self._progress.pop(_uid(old) or "", None)
        self._notebooks[name] = dict(obj)
        if not is_spawning(obj):
            self._progress.pop(_uid(obj) or "", None)
        self._show(name)

    def _remove(self, name: str) -> None:
        obj = self._notebooks.pop(name, None)
        if obj is not None:
            self._progress.pop(_uid(obj) or "", None)
        owner, _ = self._shown.pop(name, (None, None))
        if owner:
            self._publish(owner, name, {"type": "notebook_deleted", "name": name})

    def _show(self, name: str) -> None:
        obj = self._notebooks[name]
        view = notebook_view(obj, self._progress.get(_uid(obj) or ""))
        owner = view.get("owner")
        previous = self._shown.get(name)
        if previous == (owner, view):
            return  # e.g. only kopf's bookkeeping annotations changed
        if previous is not None and previous[0] and previous[0] != owner:
            self._publish(previous[0], name, {"type": "notebook_deleted", "name": name})
        self._shown[name] = (owner, view)
        if owner:
            self._publish(owner, name, {"type": "notebook", "notebook": view})

    # -- events re-issued on Notebooks -----------------------------------------------------

    def replace_events(self, items: Iterable[Mapping[str, Any]]) -> None:
        with self._lock:
            self._progress.clear()
            for event in sorted(items, key=event_time):
                self._take(event)
            for name in list(self._notebooks):
                self._show(name)

    def event_changed(self, change: str, event: Mapping[str, Any]) -> None:
        if change == "DELETED":
            return  # an event expiring says nothing new about a notebook
        with self._lock:
            name = self._take(event)
            if name is not None:
                self._show(name)

    def _take(self, event: Mapping[str, Any]) -> str | None:
        """Record an event as its notebook's progress; the notebook's name if it was."""
        involved = event.get("involvedObject") or {}
        notebook = self._notebooks.get(involved.get("name") or "")
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
        return notebook["metadata"]["name"]
