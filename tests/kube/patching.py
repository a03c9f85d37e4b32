"""The three PATCH flavours of the kube-apiserver, applied to plain dicts.

- JSON merge patch (RFC 7386): exact.
- JSON patch (RFC 6902): the ``jsonpatch`` library; a failed ``test`` op is a 422, like kube.
- Strategic merge patch: an approximation. Dicts merge like a merge patch; lists of objects
  whose field has a known ``patchMergeKey`` in the Kubernetes API (containers, env, ports,
  volumes, volumeMounts, conditions, ownerReferences, ...) merge item by item on that key,
  ``$patch: delete`` removes an item, ``$patch: replace`` replaces a whole map, and
  ``$deleteFromPrimitiveList/<field>`` works; ``metadata.finalizers`` merges as a set. All
  other lists are replaced, as a merge patch does. ``$retainKeys`` and ``$setElementOrder``
  are ignored. Good enough for clients that do not rely on ordering directives.
"""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch

MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"
APPLY_PATCH = ("application/apply-patch+yaml", "application/apply-patch+cbor")

# Field name -> merge key (from the patchMergeKey tags of k8s.io/api); 'ports' depends on context.
_MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "env": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "volumeDevices": "devicePath",
    "imagePullSecrets": "name",
    "conditions": "type",
    "ownerReferences": "uid",
    "hostAliases": "ip",
    "topologySpreadConstraints": "topologyKey",
    "resourceClaims": "name",
    "containerStatuses": "name",
    "initContainerStatuses": "name",
    "podIPs": "ip",
}
_SET_LISTS = {"finalizers"}


class PatchError(ValueError):
    """The patch cannot be applied; ``status`` is the HTTP status the API answers with."""

    def __init__(self, message: str, status: int = 422) -> None:
        super().__init__(message)
        self.status = status


def merge_patch(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _merge_key(field: str, items: list[Any]) -> str | None:
    if field == "ports":
        return (
            "containerPort"
            if any("containerPort" in i for i in items if isinstance(i, dict))
            else "port"
        )
    return _MERGE_KEYS.get(field)


def _strategic_list(field: str, target: list[Any], patch: list[Any]) -> list[Any]:
    if field in _SET_LISTS:
        return list(target) + [item for item in patch if item not in target]
    key = _merge_key(field, patch + target)
    if key is None or not all(isinstance(item, dict) for item in patch):
        return copy.deepcopy(patch)
    result = [copy.deepcopy(item) for item in target]
    for item in patch:
        directive = item.get("$patch")
        index = next(
            (
                i
                for i, old in enumerate(result)
                if isinstance(old, dict) and old.get(key) == item.get(key)
            ),
            None,
        )
        if directive == "delete":
            if index is not None:
                del result[index]
        elif index is None:
            result.append({k: v for k, v in item.items() if k != "$patch"})
        else:
            result[index] = strategic_merge_patch(result[index], item)
    return result


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    if patch.get("$patch") == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if key.startswith("$deleteFromPrimitiveList/"):
            field = key.split("/", 1)[1]
            result[field] = [item for item in result.get(field) or [] if item not in value]
        elif key.startswith("$"):
            continue
        elif value is None:
            result.pop(key, None)
        elif isinstance(value, list) and isinstance(result.get(key), list):
            result[key] = _strategic_list(key, result[key], value)
        elif isinstance(value, dict):
            result[key] = strategic_merge_patch(result.get(key), value)
        else:
            result[key] = copy.deepcopy(value)
    return result


def json_patch(target: dict[str, Any], ops: Any) -> dict[str, Any]:
    if not isinstance(ops, list):
        raise PatchError("json: cannot unmarshal object into Go value of type jsonpatch.Patch", 400)
    try:
        return jsonpatch.JsonPatch(ops).apply(target)
    except jsonpatch.JsonPatchTestFailed as exc:
        raise PatchError(
            f"the server rejected our request due to an error in our request: {exc}"
        ) from None
    except (
        jsonpatch.JsonPatchException,
        jsonpatch.JsonPointerException,
        KeyError,
        IndexError,
        TypeError,
    ) as exc:
        raise PatchError(
            f"the server rejected our request due to an error in our request: {exc}"
        ) from None


def apply_patch(content_type: str, target: dict[str, Any], patch: Any) -> dict[str, Any]:
    """Apply a PATCH body of the given Content-Type; raises PatchError like the API would."""
    content_type = content_type.split(";")[0].strip().lower()
    if content_type == JSON_PATCH:
        return json_patch(target, patch)
    if content_type in (MERGE_PATCH, STRATEGIC_MERGE_PATCH):
        if not isinstance(patch, dict):
            raise PatchError(
                "the body of the request was in an unknown format: expected an object", 400
            )
        if content_type == MERGE_PATCH:
            return merge_patch(target, patch)
        return strategic_merge_patch(target, patch)
    if content_type in APPLY_PATCH:
        raise PatchError("server-side apply is not supported by this emulator", 415)
    raise PatchError(
        f"the body of the request was in an unknown format - accepted media types "
        f"include: {JSON_PATCH}, {MERGE_PATCH}, {STRATEGIC_MERGE_PATCH}",
        415,
    )
