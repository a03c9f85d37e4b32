"""The emulator's storage: objects per group-resource, one resourceVersion counter, an event
history for watches (a bounded window, like etcd compaction), and owner/uid indexes for GC.

Everything here runs on the emulator's event loop thread and never awaits, so each write is
atomic with respect to every request being served.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

GroupResource = tuple[str, str]  # ('apps', 'statefulsets')
Key = tuple[str, str]  # (namespace or '' for cluster-scoped, name)
Ref = tuple[GroupResource, Key]


class Expired(Exception):
    """A watch asked for history that has been compacted away (the API answers 410 Gone)."""


@dataclass(frozen=True)
class Event:
    rv: int
    group_resource: GroupResource
    type: str  # ADDED, MODIFIED, DELETED
    obj: dict[str, Any]
    old: dict[str, Any] | None
    # `obj` as JSON, by the apiVersion it was served as: made once for the write's reply and
    # every watch of that version.
    texts: dict[str, str] = field(default_factory=dict, compare=False, repr=False)

    def text(self, api_version: str, render: Callable[[], str]) -> str:
        known = self.texts.get(api_version)
        if known is None:
            known = self.texts[api_version] = render()
        return known


@dataclass(eq=False)
class Watcher:
    group_resource: GroupResource
    queue: asyncio.Queue[Event] = field(default_factory=asyncio.Queue)


def key_of(obj: dict[str, Any]) -> Key:
    meta = obj["metadata"]
    return (meta.get("namespace") or "", meta["name"])


def owner_uids(obj: dict[str, Any]) -> set[str]:
    return {ref["uid"] for ref in obj["metadata"].get("ownerReferences") or [] if "uid" in ref}


class Store:
    def __init__(self, window: int = 10_000, first_rv: int = 1000) -> None:
        self.rv = first_rv
        self.compacted_rv = first_rv
        self._objects: dict[GroupResource, dict[Key, dict[str, Any]]] = collections.defaultdict(
            dict
        )
        self._by_uid: dict[str, Ref] = {}
        self._dependents: dict[str, set[Ref]] = collections.defaultdict(set)
        self._history: collections.deque[Event] = collections.deque(maxlen=window)
        self.watchers: set[Watcher] = set()
        self.last_event: Event | None = None

    # -- reading ---------------------------------------------------------------------------
    def get(self, gr: GroupResource, key: Key) -> dict[str, Any] | None:
        return self._objects[gr].get(key)

    def items(self, gr: GroupResource, namespace: str | None = None) -> list[dict[str, Any]]:
        objs = self._objects[gr]
        return [
            obj for (ns, _), obj in sorted(objs.items()) if namespace is None or ns == namespace
        ]

    def count(self, gr: GroupResource) -> int:
        return len(self._objects.get(gr, ()))

    def by_uid(self, uid: str) -> Ref | None:
        return self._by_uid.get(uid)

    def dependents_of(self, uid: str) -> list[Ref]:
        return sorted(self._dependents.get(uid, ()))

    def all_refs(self) -> Iterator[Ref]:
        for gr, objs in self._objects.items():
            for key in list(objs):
                yield gr, key

    def namespaced_refs(self, namespace: str) -> list[Ref]:
        return [
            (gr, key) for gr, objs in self._objects.items() for key in objs if key[0] == namespace
        ]

    def events_since(self, rv: int) -> list[Event]:
        if rv < self.compacted_rv:
            raise Expired(f"too old resource version: {rv} ({self.compacted_rv})")
        return [event for event in self._history if event.rv > rv]

    # -- writing ---------------------------------------------------------------------------
    def next_rv(self) -> int:
        self.rv += 1
        return self.rv

    def put(self, gr: GroupResource, obj: dict[str, Any]) -> dict[str, Any]:
        """Store a new object version (its resourceVersion is assigned here) and announce it."""
        key = key_of(obj)
        old = self._objects[gr].get(key)
        obj["metadata"]["resourceVersion"] = str(self.next_rv())
        self._objects[gr][key] = obj
        self._index(gr, key, old, obj)
        self._record(Event(self.rv, gr, "MODIFIED" if old is not None else "ADDED", obj, old))
        return obj

    def remove(self, gr: GroupResource, key: Key) -> dict[str, Any] | None:
        old = self._objects[gr].pop(key, None)
        if old is None:
            return None
        gone = {**old, "metadata": {**old["metadata"], "resourceVersion": str(self.next_rv())}}
        self._index(gr, key, old, None)
        self._record(Event(self.rv, gr, "DELETED", gone, old))
        return gone

    def drop_group_resource(self, gr: GroupResource) -> None:
        for key in list(self._objects[gr]):
            self.remove(gr, key)

    def compact(self) -> None:
        """Forget all watch history, like an etcd compaction (older watches get 410 Gone)."""
        self._history.clear()
        self.compacted_rv = self.rv

    def _index(
        self, gr: GroupResource, key: Key, old: dict[str, Any] | None, new: dict[str, Any] | None
    ) -> None:
        if old is not None:
            self._by_uid.pop(old["metadata"]["uid"], None)
            for uid in owner_uids(old):
                self._dependents[uid].discard((gr, key))
                if not self._dependents[uid]:
                    del self._dependents[uid]
        if new is not None:
            self._by_uid[new["metadata"]["uid"]] = (gr, key)
            for uid in owner_uids(new):
                self._dependents[uid].add((gr, key))

    def _record(self, event: Event) -> None:
        if len(self._history) == self._history.maxlen:
            self.compacted_rv = self._history[0].rv
        self._history.append(event)
        self.last_event = event
        for watcher in self.watchers:
            if watcher.group_resource == event.group_resource:
                watcher.queue.put_nowait(event)
