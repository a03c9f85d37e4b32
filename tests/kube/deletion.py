"""Deleting: DeleteOptions, finalizers, and the garbage collector (ownerReference cascade in
background/foreground/orphan mode, dependents of absent owners, namespace termination)."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import aiohttp.web
import kmock

from .catalogue import CRDS, NAMESPACES, PODS, ResourceType
from .protocol import ApiError, bad_request, json_reply, now_rfc3339
from .store import GroupResource, Key, Store, owner_uids


class Deletion:
    """Deletion and garbage collection of RealisticKubernetes (a mixin)."""

    if TYPE_CHECKING:  # provided by the other parts of RealisticKubernetes

        def _require(self, rtype: ResourceType, ns: str | None, name: str) -> dict[str, Any]: ...
        def _present(self, rtype: ResourceType, obj: Mapping[str, Any]) -> dict[str, Any]: ...
        def _selectors(
            self, rtype: ResourceType, params: Mapping[str, str]
        ) -> Callable[[Mapping[str, Any]], bool]: ...

    _store: Store
    _catalogue: Any
    _logs: Any
    _gc_wakeup: asyncio.Event | None
    _gc_orphans: set[tuple[GroupResource, Key]]
    _gc_foreground: set[tuple[GroupResource, Key]]
    _gc_namespaces: set[str]
    gc_delay: float

    def _delete_options(self, request: kmock.Request) -> dict[str, Any]:
        options = dict(request.data) if isinstance(request.data, dict) else {}
        for key in ("propagationPolicy", "gracePeriodSeconds", "dryRun"):
            if key in request.params:
                options[key] = request.params[key]
        if "orphanDependents" in options and "propagationPolicy" not in options:
            options["propagationPolicy"] = "Orphan" if options["orphanDependents"] else "Background"
        policy = options.get("propagationPolicy", "Background")
        if policy not in ("Background", "Foreground", "Orphan"):
            raise bad_request(f"propagationPolicy: Unsupported value: {policy!r}")
        return options

    def _delete_request(
        self, rtype: ResourceType, ns: str | None, name: str, request: kmock.Request
    ) -> aiohttp.web.Response:
        options = self._delete_options(request)
        obj = self._require(rtype, ns, name)
        pre = options.get("preconditions") or {}
        if (pre.get("uid") and pre["uid"] != obj["metadata"]["uid"]) or (
            pre.get("resourceVersion")
            and pre["resourceVersion"] != obj["metadata"]["resourceVersion"]
        ):
            raise ApiError(
                409,
                "Conflict",
                f"Operation cannot be fulfilled on {rtype.qualified_name} "
                f'"{name}": Precondition failed',
                {"name": name, "kind": rtype.plural},
            )
        if options.get("dryRun") in ("All", ["All"]):
            return json_reply(200, self._present(rtype, obj))
        result = self._delete(
            rtype.group_resource, (ns or "", name), options.get("propagationPolicy", "Background")
        )
        return json_reply(200, self._present(rtype, result))

    def _delete_collection(
        self, rtype: ResourceType, ns: str | None, request: kmock.Request
    ) -> aiohttp.web.Response:
        options = self._delete_options(request)
        selected = self._selectors(rtype, request.params)
        items = [o for o in self._store.items(rtype.group_resource, ns) if selected(o)]
        deleted = [
            self._delete(
                rtype.group_resource,
                (ns or "", o["metadata"]["name"]),
                options.get("propagationPolicy", "Background"),
            )
            for o in items
        ]
        return json_reply(
            200,
            {
                "kind": f"{rtype.kind}List",
                "apiVersion": rtype.api_version,
                "metadata": {"resourceVersion": str(self._store.rv)},
                "items": [self._present(rtype, o) for o in deleted],
            },
        )

    def _delete(self, gr: GroupResource, key: Key, policy: str) -> dict[str, Any]:
        """Delete now, or mark for deletion while finalizers (or dependents) remain."""
        obj = self._store.get(gr, key)
        assert obj is not None
        meta = obj["metadata"]
        if meta.get("deletionTimestamp"):
            return obj
        if gr == NAMESPACES:
            policy = "Background"  # the namespace controller empties it first, whatever asked
        if policy == "Orphan":
            self._orphan_dependents(meta["uid"])
        finalizers = list(meta.get("finalizers") or [])
        if policy == "Foreground" and "foregroundDeletion" not in finalizers:
            finalizers.append("foregroundDeletion")
        namespace_terminating = gr == NAMESPACES
        if not finalizers and not namespace_terminating:
            return self._remove(gr, key) or obj
        marked = copy.deepcopy(obj)
        marked["metadata"].update(deletionTimestamp=now_rfc3339(), deletionGracePeriodSeconds=0)
        if finalizers:
            marked["metadata"]["finalizers"] = finalizers
        if namespace_terminating:
            marked["status"] = {**marked.get("status", {}), "phase": "Terminating"}
            self._gc_namespaces.add(key[1])
        if "foregroundDeletion" in finalizers:
            self._gc_foreground.add((gr, key))
        self._store.put(gr, marked)
        self._wake_gc()
        return marked

    def _orphan_dependents(self, uid: str) -> None:
        for gr, key in self._store.dependents_of(uid):
            dependent = copy.deepcopy(self._store.get(gr, key))
            if dependent is None:
                continue
            refs = [
                r for r in dependent["metadata"].get("ownerReferences", []) if r.get("uid") != uid
            ]
            if refs:
                dependent["metadata"]["ownerReferences"] = refs
            else:
                dependent["metadata"].pop("ownerReferences", None)
            self._store.put(gr, dependent)

    def _remove(self, gr: GroupResource, key: Key) -> dict[str, Any] | None:
        gone = self._store.remove(gr, key)
        if gone is None:
            return None
        uid = gone["metadata"]["uid"]
        self._gc_orphans.update(self._store.dependents_of(uid))
        if gr == CRDS:
            spec = gone["spec"]
            self._catalogue.remove_crd(gone["metadata"]["name"])
            self._store.drop_group_resource((spec["group"], spec["names"]["plural"]))
        if gr == PODS and self._logs is not None:
            asyncio.get_running_loop().create_task(self._logs.forget_pod(*key))
        self._wake_gc()
        return gone

    def _wake_gc(self) -> None:
        if self._gc_wakeup is not None:
            self._gc_wakeup.set()

    async def _gc_loop(self) -> None:
        assert self._gc_wakeup is not None
        while True:
            await self._gc_wakeup.wait()
            self._gc_wakeup.clear()
            await asyncio.sleep(self.gc_delay)  # real collectors are asynchronous too
            self.collect_garbage()

    def collect_garbage(self) -> None:
        """One pass of the garbage collector and the namespace controller (idempotent)."""
        progress = True
        while progress:
            progress = False
            for gr, key in list(self._gc_orphans):
                self._gc_orphans.discard((gr, key))
                obj = self._store.get(gr, key)
                uids = owner_uids(obj) if obj else set()
                if obj and uids and all(self._store.by_uid(uid) is None for uid in uids):
                    self._delete(gr, key, "Background")
                    progress = True
            for gr, key in list(self._gc_foreground):
                progress |= self._finish_foreground(gr, key)
            for name in list(self._gc_namespaces):
                progress |= self._finish_namespace(name)

    def _start_deleting(self, refs: list[tuple[GroupResource, Key]], policy: str) -> bool:
        """Delete those of ``refs`` not already being deleted; whether any was."""
        changed = False
        for gr, key in refs:
            obj = self._store.get(gr, key)
            if obj is not None and not obj["metadata"].get("deletionTimestamp"):
                self._delete(gr, key, policy)
                changed = True
        return changed

    def _finish_foreground(self, gr: GroupResource, key: Key) -> bool:
        obj = self._store.get(gr, key)
        if obj is None or "foregroundDeletion" not in (obj["metadata"].get("finalizers") or []):
            self._gc_foreground.discard((gr, key))
            return False
        dependents = self._store.dependents_of(obj["metadata"]["uid"])
        if dependents:
            return self._start_deleting(dependents, "Foreground")
        self._gc_foreground.discard((gr, key))
        released = copy.deepcopy(obj)
        released["metadata"]["finalizers"] = [
            f for f in obj["metadata"]["finalizers"] if f != "foregroundDeletion"
        ]
        if released["metadata"]["finalizers"]:
            self._store.put(gr, released)
        else:
            self._remove(gr, key)
        return True

    def _finish_namespace(self, name: str) -> bool:
        namespace = self._store.get(NAMESPACES, ("", name))
        if namespace is None:
            self._gc_namespaces.discard(name)
            return False
        refs = self._store.namespaced_refs(name)
        if refs:
            return self._start_deleting(refs, "Background")
        self._gc_namespaces.discard(name)
        if not namespace["metadata"].get("finalizers"):
            self._remove(NAMESPACES, ("", name))
        return True
