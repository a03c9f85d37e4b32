"""Writing: create, replace, patch, the status subresource, and admission (defaults,
pruning, validation, immutability, finalizer rules, resourceVersion preconditions)."""

from __future__ import annotations

import asyncio
import copy
import json
import random
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import aiohttp.web
import kmock
import yaml

from . import patching, rules, validation
from .catalogue import CRDS, NAMESPACES, PODS, Catalogue, ResourceType
from .protocol import ApiError, bad_request, invalid, json_reply, now_rfc3339, text_reply
from .store import GroupResource, Key, Store, owner_uids

_NAME_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"  # what the apiserver uses for generateName


def _without_rv(obj: Mapping[str, Any]) -> dict[str, Any]:
    meta = {k: v for k, v in obj.get("metadata", {}).items() if k != "resourceVersion"}
    return {**obj, "metadata": meta}


def _spec_part(obj: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in obj.items() if k not in ("metadata", "status", "apiVersion", "kind")}


def _check_update(
    rtype: ResourceType,
    ns: str | None,
    name: str,
    new: dict[str, Any],
    old: dict[str, Any],
    *,
    replace: bool,
) -> None:
    """An update's preconditions, as the API server checks them: its metadata names the
    object on the URL, and its resourceVersion (if any; a custom resource's replace must
    give one) is the stored one."""
    meta = new.get("metadata")
    if not isinstance(meta, dict):
        raise bad_request("metadata must be an object")
    if meta.get("name", name) != name:
        raise bad_request(
            f"the name of the object ({meta.get('name')}) does not match the name "
            f"on the URL ({name})"
        )
    if rtype.namespaced and meta.get("namespace", ns) != ns:
        raise bad_request(
            "the namespace of the provided object does not match the namespace sent on the request"
        )
    rv = meta.get("resourceVersion")
    if rv and rv != old["metadata"]["resourceVersion"]:
        raise ApiError(
            409,
            "Conflict",
            f"Operation cannot be fulfilled on {rtype.qualified_name} "
            f'"{name}": the object has been modified; please apply your changes to '
            f"the latest version and try again",
            {"name": name, "group": rtype.group, "kind": rtype.plural},
        )
    if replace and not rv and rtype.crd_name is not None:
        raise invalid(
            rtype,
            name,
            [
                validation.Cause(
                    "metadata.resourceVersion",
                    "Invalid value: 0x0: must be specified for an update",
                )
            ],
        )


def _carried_over(
    rtype: ResourceType,
    ns: str | None,
    name: str,
    new: dict[str, Any],
    old: dict[str, Any],
    subresource: str | None,
) -> dict[str, Any]:
    """What an update may not change, taken from the stored object: through /status all
    but the status; otherwise the status (when the kind has the subresource) and the
    server's metadata."""
    if subresource == "status":
        # Only the status changes through /status; everything else is the stored object's.
        new = {**copy.deepcopy(old), "status": new.get("status")}
        if new["status"] is None:
            del new["status"]
        return new
    if rtype.has_status:
        new = {k: v for k, v in new.items() if k != "status"}
        if "status" in old:
            new["status"] = copy.deepcopy(old["status"])
    meta = new["metadata"]
    for key in (
        "uid",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "generation",
    ):
        if key in old["metadata"]:
            meta[key] = old["metadata"][key]
        else:
            meta.pop(key, None)
    meta["name"] = name
    if rtype.namespaced:
        meta["namespace"] = ns
    return new


def _check_finalizers(
    rtype: ResourceType, name: str, meta: dict[str, Any], old: dict[str, Any]
) -> None:
    """An object being deleted takes no new finalizers."""
    if not old["metadata"].get("deletionTimestamp"):
        return
    added = set(meta.get("finalizers") or []) - set(old["metadata"].get("finalizers") or [])
    if added:
        raise invalid(
            rtype,
            name,
            [
                validation.Cause(
                    "metadata.finalizers",
                    f"Forbidden: no new finalizers can be added if the "
                    f"object is being deleted, found new finalizers {sorted(added)}",
                )
            ],
        )


class Writes:
    """Create/update/patch of RealisticKubernetes (a mixin: the state lives on the emulator)."""

    if TYPE_CHECKING:  # provided by the other parts of RealisticKubernetes

        def _require(self, rtype: ResourceType, ns: str | None, name: str) -> dict[str, Any]: ...
        def _present(self, rtype: ResourceType, obj: Mapping[str, Any]) -> dict[str, Any]: ...
        def _remove(self, gr: GroupResource, key: Key) -> dict[str, Any] | None: ...
        def _wake_gc(self) -> None: ...

    _store: Store
    _catalogue: Catalogue
    _gc_orphans: set[tuple[GroupResource, Key]]
    _logs: Any

    def _body(self, request: kmock.Request) -> dict[str, Any]:
        content_type = request.headers.get("Content-Type", "application/json").split(";")[0]
        if "yaml" in content_type:
            try:
                data = yaml.safe_load(request.body)
            except yaml.YAMLError as exc:
                raise bad_request(
                    f"the body of the request was in an unknown format: {exc}"
                ) from None
        elif request.body:
            try:
                data = json.loads(request.body)
            except ValueError as exc:
                raise bad_request(
                    f"the body of the request was in an unknown format: {exc}"
                ) from None
        else:
            data = None
        if not isinstance(data, dict):
            raise bad_request("the body of the request must be a JSON object")
        return data

    def _check_type(self, rtype: ResourceType, obj: Mapping[str, Any]) -> None:
        if obj.get("kind") != rtype.kind or not obj.get("apiVersion"):
            raise bad_request(
                f"the kind in the body ({obj.get('kind')!r}) does not match the "
                f"expected kind {rtype.kind!r} (apiVersion and kind are required)"
            )
        if obj["apiVersion"] != rtype.api_version:
            raise bad_request(
                f"the API version in the data ({obj['apiVersion']}) does not match "
                f"the expected API version ({rtype.api_version})"
            )

    @staticmethod
    def _new_object_meta(obj: dict[str, Any]) -> dict[str, Any]:
        meta = obj["metadata"]
        meta.update(uid=str(uuid.uuid4()), creationTimestamp=now_rfc3339(), generation=1)
        for key in ("deletionTimestamp", "deletionGracePeriodSeconds", "managedFields"):
            meta.pop(key, None)
        return obj

    def _admit(
        self,
        rtype: ResourceType,
        obj: dict[str, Any],
        old: dict[str, Any] | None,
        params: Mapping[str, str],
    ) -> list[str]:
        """Prune/default, validate, check immutability. Returns warnings; raises ApiError."""
        warnings: list[str] = []
        name = obj["metadata"].get("name", "")
        if rtype.schema is not None or rtype.crd_name is not None:
            pruned, unknown = validation.prune_and_default(obj, rtype.schema)
            if unknown and params.get("fieldValidation") == "Strict":
                raise bad_request(
                    "strict decoding error: "
                    + ", ".join(f'unknown field "{field}"' for field in unknown)
                )
            warnings += [f'unknown field "{field}"' for field in unknown]
            obj.clear()
            obj.update(pruned)
            causes = validation.validate_custom(obj, rtype.schema)
        else:
            causes = validation.validate_builtin(obj) + rules.value_errors(
                rtype.group_resource, obj
            )
        causes += rules.metadata_errors(rtype.group_resource, obj["metadata"])
        if old is not None:
            causes += rules.immutable_errors(rtype.group_resource, old, obj)
        if rtype.group_resource == CRDS:
            causes += self._crd_errors(obj, old)
        if causes:
            raise invalid(rtype, name, causes)
        return warnings

    @staticmethod
    def _crd_errors(
        crd: Mapping[str, Any], old: Mapping[str, Any] | None
    ) -> list[validation.Cause]:
        spec = crd.get("spec", {})
        causes = []
        expected = f"{spec.get('names', {}).get('plural')}.{spec.get('group')}"
        if crd["metadata"].get("name") != expected:
            causes.append(
                validation.Cause(
                    "metadata.name", f'must be spec.names.plural+"."+spec.group ({expected})'
                )
            )
        if sum(bool(v.get("storage")) for v in spec.get("versions", [])) != 1:
            causes.append(
                validation.Cause(
                    "spec.versions", "must have exactly one version marked as storage version"
                )
            )
        if old is not None and old["spec"].get("scope") != spec.get("scope"):
            causes.append(validation.Cause("spec.scope", "field is immutable"))
        return causes

    def _namespace_gate(self, rtype: ResourceType, ns: str | None) -> None:
        if not rtype.namespaced:
            return
        namespace = self._store.get(NAMESPACES, ("", ns or ""))
        if namespace is None:
            raise ApiError(
                404, "NotFound", f'namespaces "{ns}" not found', {"name": ns, "kind": "namespaces"}
            )
        if namespace["metadata"].get("deletionTimestamp"):
            raise ApiError(
                403,
                "Forbidden",
                f'{rtype.plural} "" is forbidden: unable to create new '
                f"content in namespace {ns} because it is being terminated",
            )

    def _create(
        self, rtype: ResourceType, ns: str | None, request: kmock.Request
    ) -> aiohttp.web.Response:
        obj = self._body(request)  # parsed afresh from the request: ours to change
        self._check_type(rtype, obj)
        meta = obj.setdefault("metadata", {})
        if not isinstance(meta, dict):
            raise bad_request("metadata must be an object")
        if rtype.namespaced:
            if meta.get("namespace") and meta["namespace"] != ns:
                raise bad_request(
                    "the namespace of the provided object does not match the "
                    "namespace sent on the request"
                )
            meta["namespace"] = ns
        else:
            meta.pop("namespace", None)
        if meta.get("resourceVersion"):
            raise bad_request("resourceVersion should not be set on objects to be created")
        if not meta.get("name"):
            if not meta.get("generateName"):
                raise invalid(
                    rtype,
                    "",
                    [
                        validation.Cause(
                            "metadata.name",
                            "name or generateName is required",
                            "FieldValueRequired",
                        )
                    ],
                )
            meta["name"] = meta["generateName"] + "".join(random.choices(_NAME_ALPHABET, k=5))
        self._namespace_gate(rtype, ns)
        if rtype.has_status:
            obj.pop("status", None)
        self._new_object_meta(obj)
        rules.apply_create_defaults(rtype.group_resource, obj)
        rules.apply_defaults(rtype.group_resource, obj)
        warnings = self._admit(rtype, obj, None, request.params)
        existing = self._store.get(rtype.group_resource, (ns or "", meta["name"]))
        if existing is not None:
            raise ApiError(
                409,
                "AlreadyExists",
                f'{rtype.qualified_name} "{meta["name"]}" already exists',
                {"name": meta["name"], "group": rtype.group, "kind": rtype.plural},
            )
        return self._write(rtype, None, obj, 201, warnings, request.params)

    def _write(
        self,
        rtype: ResourceType,
        old: dict[str, Any] | None,
        new: dict[str, Any],
        code: int,
        warnings: list[str],
        params: Mapping[str, str],
    ) -> aiohttp.web.Response:
        """Store `new` (not on a dry run), tell the watchers, and answer it."""
        if params.get("dryRun") == "All":
            return json_reply(code, self._present(rtype, new), warnings)
        self._store.put(rtype.group_resource, new)
        event = self._store.last_event
        assert event is not None and event.obj is new
        text = event.text(rtype.api_version, lambda: json.dumps(self._present(rtype, new)))
        self._after_write(rtype, old, new)
        return text_reply(code, text, warnings)

    def _update(
        self,
        rtype: ResourceType,
        ns: str | None,
        name: str,
        new: dict[str, Any],
        subresource: str | None,
        params: Mapping[str, str],
        *,
        replace: bool,
    ) -> aiohttp.web.Response:
        old = self._require(rtype, ns, name)
        self._check_type(rtype, new)
        _check_update(rtype, ns, name, new, old, replace=replace)
        new = _carried_over(rtype, ns, name, new, old, subresource)
        meta = new["metadata"]
        _check_finalizers(rtype, name, meta, old)
        rules.apply_defaults(rtype.group_resource, new)
        warnings = self._admit(rtype, new, old, params)
        meta["resourceVersion"] = old["metadata"]["resourceVersion"]
        if _without_rv(new) == _without_rv(old):
            return json_reply(
                200, self._present(rtype, old), warnings
            )  # no-op: no new version, no event
        if _spec_part(new) != _spec_part(old) or (
            not rtype.has_status and new.get("status") != old.get("status")
        ):
            meta["generation"] = int(old["metadata"].get("generation", 1)) + 1
        finalized = meta.get("deletionTimestamp") and not meta.get("finalizers")
        if finalized and params.get("dryRun") != "All":
            gone = self._remove(rtype.group_resource, (ns or "", name))
            return json_reply(200, self._present(rtype, gone or new), warnings)
        return self._write(rtype, old, new, 200, warnings, params)

    def _replace(
        self,
        rtype: ResourceType,
        ns: str | None,
        name: str,
        request: kmock.Request,
        subresource: str | None,
    ) -> aiohttp.web.Response:
        return self._update(
            rtype,
            ns,
            name,
            self._body(request),  # parsed afresh from the request: ours to change
            subresource,
            request.params,
            replace=True,
        )

    def _patch(
        self,
        rtype: ResourceType,
        ns: str | None,
        name: str,
        request: kmock.Request,
        subresource: str | None,
    ) -> aiohttp.web.Response:
        old = self._require(rtype, ns, name)
        try:
            patch = json.loads(request.body) if request.body else None
        except ValueError as exc:
            raise bad_request(f"the body of the request was in an unknown format: {exc}") from None
        content_type = request.headers.get("Content-Type", "")
        if rtype.crd_name is not None and content_type.startswith(patching.STRATEGIC_MERGE_PATCH):
            # Custom resources have no patch strategies to merge by (as on a real server).
            raise ApiError(
                415,
                "UnsupportedMediaType",
                "the body of the request was in an unknown "
                f"format - accepted media types include: {patching.JSON_PATCH}, "
                f"{patching.MERGE_PATCH}, {patching.APPLY_PATCH[0]}",
            )
        try:
            patched = patching.apply_patch(content_type, copy.deepcopy(old), patch)
        except patching.PatchError as exc:
            raise ApiError(
                exc.status,
                {400: "BadRequest", 415: "UnsupportedMediaType"}.get(exc.status, "Invalid"),
                str(exc),
            ) from None
        if not isinstance(patched.get("metadata"), dict):
            raise bad_request("metadata must be an object")
        if patched["metadata"].get("resourceVersion") == old["metadata"]["resourceVersion"]:
            patched["metadata"].pop("resourceVersion")  # unchanged = no precondition
        return self._update(rtype, ns, name, patched, subresource, request.params, replace=False)

    def _after_write(
        self, rtype: ResourceType, old: dict[str, Any] | None, new: dict[str, Any]
    ) -> None:
        if rtype.group_resource == CRDS:
            self._catalogue.install_crd(new)
            self._establish_crd(rtype, new)
        if new["metadata"].get("ownerReferences") and any(
            self._store.by_uid(uid) is None for uid in owner_uids(new)
        ):
            self._gc_orphans.add(
                (
                    rtype.group_resource,
                    (new["metadata"].get("namespace") or "", new["metadata"]["name"]),
                )
            )
            self._wake_gc()
        if rtype.group_resource == PODS and self._logs is not None:
            asyncio.get_running_loop().create_task(self._logs.notify())

    def _establish_crd(self, rtype: ResourceType, crd: dict[str, Any]) -> None:
        names = crd["spec"]["names"]
        accepted = {k: v for k, v in names.items()}
        status = {
            "acceptedNames": accepted,
            "storedVersions": sorted(
                {
                    *crd.get("status", {}).get("storedVersions", []),
                    *[v["name"] for v in crd["spec"]["versions"] if v.get("storage")],
                }
            ),
            "conditions": [
                {
                    "type": t,
                    "status": "True",
                    "reason": r,
                    "message": m,
                    "lastTransitionTime": now_rfc3339(),
                }
                for t, r, m in (
                    ("NamesAccepted", "NoConflicts", "no conflicts found"),
                    ("Established", "InitialNamesAccepted", "the initial names have been accepted"),
                )
            ],
        }
        if crd.get("status") != status:
            self._store.put(CRDS, {**crd, "status": status})
