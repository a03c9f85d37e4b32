"""What the controller owns, mirrored in memory: the Notebooks' StatefulSets, Services, PVCs,
VirtualServices, AuthorizationPolicies and pods, each kind kept by a list-watch of its own
(the project's one loop, `kubeconn.ListWatch`, in a thread: it lists, watches from the
list's resourceVersion, resumes, lists again after 410 Gone, backs off on failure).

Why not kopf's indexes and `on.event` handlers, as for the Notebooks themselves: kopf runs
each watch event through its whole per-object machinery (a worker task per object, loggers,
causes, handler invocation), about a millisecond of CPU an event. Four of a new Notebook's six
events are of its children, and that was most of the controller's CPU in a burst (10,000
Notebooks: 14.7 ms a Notebook; the children outside kopf: see the README). Here an event is
parsed in its watch thread and handed to the event loop, which keeps what the handlers read
(slim.py) and calls the controller only for what is not the echo of its own write.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from jupyterlab_mlcluster import kubeconn

from .crd import GROUP, KIND
from .objects import LABEL_NOTEBOOK
from .slim import slim_owned, slim_pod

log = logging.getLogger("notebook_controller")
WATCH_FAILURES = kubeconn.FailureLog(log)

NotebookKey = tuple[str, str]  # namespace, name
# (kind, index name, plural) of what a Notebook owns; the Istio kinds' versions are found
# at run time (objects.IstioVersions).
OWNED_KINDS: dict[str, tuple[str, str]] = {
    "StatefulSet": ("owned_statefulsets", "statefulsets"),
    "Service": ("owned_services", "services"),
    "PersistentVolumeClaim": ("owned_claims", "persistentvolumeclaims"),
    "VirtualService": ("owned_virtualservices", "virtualservices"),
    "AuthorizationPolicy": ("owned_authorizationpolicies", "authorizationpolicies"),
    "Pod": ("owned_pods", "pods"),
}
# Events parsed by the watch threads and not yet handled in the event loop, at most: a
# watch thread parses faster than the loop handles, and each waiting event is a whole parsed
# object (at 10,000 Notebooks, unbounded, the backlog took the controller from ~300 to 565
# MiB). A full backlog holds the threads back, and so their streams, as an informer's would.
MAX_PENDING_EVENTS = 256
API_VERSIONS = {
    "StatefulSet": "apps/v1",
    "Service": "v1",
    "PersistentVolumeClaim": "v1",
    "Pod": "v1",
}


def notebook_of(obj: Mapping[str, Any]) -> str | None:
    """The Notebook an object belongs to: a pod by its label (its owner is the
    StatefulSet, whose uid the status checks), anything else by its controller
    ownerReference naming a Notebook (uids are checked where they are used)."""
    meta = obj.get("metadata") or {}
    if obj.get("kind") == "Pod":
        return (meta.get("labels") or {}).get(LABEL_NOTEBOOK) or None
    for ref in meta.get("ownerReferences") or ():
        if (
            ref.get("kind") == KIND
            and ref.get("controller")
            and str(ref.get("apiVersion", "")).startswith(f"{GROUP}/")
        ):
            return str(ref.get("name"))
    return None


class OwnedIndex:
    """One kind's objects by the Notebook they belong to: `get(key)` lists them (read,
    never changed: each is what slim.py keeps of it)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._by_key: dict[NotebookKey, dict[str, dict[str, Any]]] = {}
        self._key_of: dict[str, NotebookKey] = {}  # uid -> where it is kept

    def __len__(self) -> int:
        return len(self._key_of)

    def __iter__(self) -> Iterator[NotebookKey]:  # the keys, as a kopf index's
        return iter(list(self._by_key))

    def get(self, key: NotebookKey, default: Any = ()) -> Any:
        found = self._by_key.get(key)
        return list(found.values()) if found else default

    def put(self, obj: Mapping[str, Any]) -> None:
        uid = obj["metadata"].get("uid")
        if not uid:
            return
        where = self._key_of.get(uid)
        previous = self._by_key[where].get(uid) if where is not None else None
        self.remove(uid)
        self._keep(uid, obj, previous)

    def remove(self, uid: str) -> None:
        key = self._key_of.pop(uid, None)
        if key is not None:
            kept = self._by_key.get(key, {})
            kept.pop(uid, None)
            if not kept:
                self._by_key.pop(key, None)

    def replace(self, objs: Iterable[Mapping[str, Any]], namespace: str = "") -> None:
        """A (re)list of one namespace ("": of all): exactly these there, each keeping its
        packed spec if it is unchanged."""
        old = {}
        for key in [k for k in self._by_key if not namespace or k[0] == namespace]:
            for uid, kept in self._by_key.pop(key).items():
                old[uid] = kept
                del self._key_of[uid]
        for obj in objs:
            uid = obj["metadata"].get("uid")
            if uid:
                self._keep(uid, obj, old.get(uid))

    def _keep(self, uid: str, obj: Mapping[str, Any], previous: dict[str, Any] | None) -> None:
        notebook = notebook_of(obj)
        if notebook is None:
            return  # not (or no longer) a Notebook's
        key = (str(obj["metadata"].get("namespace") or ""), notebook)
        slim = slim_pod(obj) if self.kind == "Pod" else slim_owned(obj, previous)
        self._by_key.setdefault(key, {})[uid] = slim
        self._key_of[uid] = key


Changed = Callable[[str, str, dict[str, Any]], None]  # kind, event type, the object


class OwnedObjects:
    """The controller's mirror of what Notebooks own: one `OwnedIndex` per kind, kept by
    list-watches (one per kind and served namespace, each in a thread) whose events reach
    the event loop; `changed(kind, type, obj)` is called there for each event after the
    index has it (not for listings: the Notebooks' own resume and resync look at those)."""

    def __init__(self, changed: Changed, namespaces: Iterable[str] = ()) -> None:
        self.changed = changed
        self.namespaces = list(namespaces) or [""]  # "": every namespace
        self.indexes: dict[str, OwnedIndex] = {
            name: OwnedIndex(kind) for kind, (name, _) in OWNED_KINDS.items()
        }
        self._index_of = {kind: self.indexes[name] for kind, (name, _) in OWNED_KINDS.items()}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._conn: kubeconn.Connection | None = None
        self._stopping = threading.Event()
        self._watches: dict[tuple[str, str], tuple[kubeconn.ListWatch, threading.Thread]] = {}
        self._api_versions: dict[str, str] = {}
        self._unlisted: set[tuple[str, str]] = set()  # watches that have not listed yet
        self._listed = asyncio.Event()
        self._listed.set()
        self._pending = threading.BoundedSemaphore(MAX_PENDING_EVENTS)

    async def start(self, kubeconfig: str, kinds: Mapping[str, str]) -> None:
        """Watch `kinds` (kind -> apiVersion); more can be added later (`watch`)."""
        self._loop = asyncio.get_running_loop()
        # One connection per watch thread (a pool connection each), none for other calls.
        pool = len(OWNED_KINDS) * len(self.namespaces) + 2
        self._conn = await asyncio.to_thread(
            kubeconn.connect, kubeconfig=kubeconfig, pool_size=pool
        )
        self.watch(kinds)

    def watch(self, kinds: Mapping[str, str]) -> None:
        """Start watching each of `kinds` (kind -> apiVersion) not watched yet (once
        started: `start` watches what it is given)."""
        if self._conn is None:
            return
        for kind, api_version in kinds.items():
            if kind not in self._index_of or not api_version:
                continue
            plural = OWNED_KINDS[kind][1]
            for namespace in self.namespaces:
                if (kind, namespace) in self._watches:
                    continue
                self._start_one(kind, api_version, plural, namespace)

    def _start_one(self, kind: str, api_version: str, plural: str, namespace: str) -> None:
        assert self._conn is not None and self._loop is not None
        loop, key = self._loop, (kind, namespace)
        self._api_versions[kind] = api_version
        watch = kubeconn.ConnectionListWatch(
            self._conn,
            kubeconn.resource_path(api_version, plural, namespace or None),
            {"labelSelector": LABEL_NOTEBOOK},  # exists: only Notebooks' objects are streamed
            f"the Notebooks' {plural}" + (f" in {namespace}" if namespace else ""),
            lambda items: loop.call_soon_threadsafe(self._relisted, key, items),
            lambda type, obj: self._hand_over(kind, type, obj),
            self._stopping,
            watch_timeout=600,
            failures=WATCH_FAILURES,
        )
        thread = threading.Thread(target=watch.run, name=f"watch-{plural}", daemon=True)
        self._watches[key] = (watch, thread)
        self._unlisted.add(key)
        self._listed.clear()
        thread.start()

    async def listed(self) -> None:
        """Returns once every watched kind has been listed (a reconcile reads whole indexes:
        before that, it would create what exists)."""
        await self._listed.wait()

    def _relisted(self, key: tuple[str, str], items: list[dict[str, Any]]) -> None:
        kind, namespace = key
        api_version = self._api_versions[kind]
        for item in items:  # a list's items carry neither
            item.setdefault("kind", kind)
            item.setdefault("apiVersion", api_version)
        self._index_of[kind].replace(items, namespace)
        self._unlisted.discard(key)
        if not self._unlisted:
            self._listed.set()

    def _hand_over(self, kind: str, type: str, obj: dict[str, Any]) -> None:
        """(In a watch thread.) An event to the loop, once the backlog has room."""
        while not self._pending.acquire(timeout=0.5):
            if self._stopping.is_set():
                return
        assert self._loop is not None
        try:
            self._loop.call_soon_threadsafe(self._event, kind, type, obj)
        except RuntimeError:  # the loop is closed: the controller is stopping
            self._pending.release()

    def _event(self, kind: str, type: str, obj: dict[str, Any]) -> None:
        try:
            self._handle(kind, type, obj)
        finally:
            self._pending.release()

    def _handle(self, kind: str, type: str, obj: dict[str, Any]) -> None:
        index = self._index_of[kind]
        if type == "DELETED":
            index.remove(obj["metadata"].get("uid") or "")
        else:
            index.put(obj)
        try:
            self.changed(kind, type, obj)
        except Exception:  # one object's trouble must not stop the others
            log.exception("Handling a %s event of %s failed", kind, obj["metadata"].get("name"))

    def stop(self) -> None:
        self._stopping.set()
        for watch, _ in self._watches.values():
            watch.interrupt()
        for _, thread in self._watches.values():
            thread.join(timeout=5)
        if self._conn is not None:
            self._conn.close()
