"""The Notebook resource (`notebooks.mlcluster.io`) as both its sides speak it: the shared
server, which creates, stops and shows a user's Notebooks (server/notebooks.py,
notebook_watch.py, notebook_feed.py), and the notebook-controller, which turns them into
servers. Its API group and kind, the names on what the controller makes, a notebook's
name, namespace and owner rules, the Notebook a spawn request builds, the stop and start
patches, and what the REST API and the sidebar show of one: one definition each, so the
REST API, the sidebar and `kubectl get nb` never disagree.

The server and the controller import this module rather than each other. Pure: no API calls.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Mapping
from typing import Any

from . import patterns

GROUP = "mlcluster.io"
VERSION = "v1alpha1"
PLURAL = "notebooks"
KIND = "Notebook"
API_VERSION = f"{GROUP}/{VERSION}"

LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGED_BY = "mlcluster-notebook-controller"
ANNOTATION_STOPPED = "mlcluster.io/stopped"
MAX_NAME_LENGTH = 52  # the StatefulSet's pod gets '-0' and a controller-revision-hash label

_NAME_RE = patterns.regex(patterns.NOTEBOOK_NAME)
_NAMESPACE_RE = patterns.regex(patterns.NAMESPACE)
_IDENTITY_RE = patterns.regex(patterns.IDENTITY)
_CPU_RE = patterns.regex(patterns.CPU_QUANTITY)
_MEMORY_RE = patterns.regex(patterns.MEMORY_QUANTITY)
_WORKSPACE_SIZE_RE = patterns.regex(patterns.WORKSPACE_SIZE)


class InvalidNotebook(ValueError):
    """A notebook request that cannot be turned into a Notebook (a 4xx for the caller)."""


# --- names and identity ---------------------------------------------------------------------


def notebook_name_error(name: str) -> str | None:
    """Why ``name`` cannot name a notebook server, or None when it can."""
    if not name:
        return "a notebook name is required"
    if len(name) > MAX_NAME_LENGTH:
        return f"notebook names are at most {MAX_NAME_LENGTH} characters (got {len(name)})"
    if not _NAME_RE.fullmatch(name):
        return (
            "notebook names use lower-case letters, digits and '-', start with a letter "
            f"and end with a letter or digit (got {name!r})"
        )
    return None


def namespace_error(name: str) -> str | None:
    """Why ``name`` cannot name a namespace (a DNS-1123 label), or None when it can."""
    if not _NAMESPACE_RE.fullmatch(name) or len(name) > 63:
        return (
            "namespaces are at most 63 lower-case letters, digits and '-', starting and "
            f"ending with a letter or digit (got {name!r})"
        )
    return None


def owner_error(owner: Any) -> str | None:
    """Why ``owner`` cannot be a Notebook's spec.owner (one identity), or None when it can."""
    if not isinstance(owner, str) or not owner:
        return "a notebook needs an owner"
    if not _IDENTITY_RE.fullmatch(owner):
        return (
            "a notebook's owner is one identity: at most 253 visible ASCII characters without "
            f"'*', whitespace, ',', ';', quotes or backslashes (got {owner!r})"
        )
    return None


# --- whose namespace it is -------------------------------------------------------------------

# Whose namespace it is, written by the platform (`mlcluster manifests --namespace-owner`): the
# controller refuses notebooks there for anyone else, and no Profile overrides it.
OWNER_ANNOTATION = "mlcluster.io/owner"
# What Kubeflow's profile controller writes on the namespace it makes for a Profile (the
# Profile's owner). It refuses to adopt a namespace that exists without it, but the Profile
# object stays: only this annotation says the namespace is the Profile's. A Profile's status is
# no evidence (Kubeflow sets no "Ready" condition; where users may write profiles/status, or the
# CRD has no status subresource, anyone can forge one).
KUBEFLOW_OWNER_ANNOTATION = "owner"


def profile_owner(profile: Mapping[str, Any]) -> str | None:
    """The user a Kubeflow Profile names as its owner (None: a group, a service account, or
    a Profile being deleted)."""
    if profile["metadata"].get("deletionTimestamp"):
        return None
    owner = (profile.get("spec") or {}).get("owner") or {}
    if owner.get("kind") != "User" or not owner.get("name"):
        return None
    return str(owner["name"])


def profile_dispute(profile: Mapping[str, Any], namespace: Mapping[str, Any] | None) -> str | None:
    """Why the Profile does not make its owner the owner of the namespace of its name, or
    None when it does.

    A Profile is a claim anyone allowed to create Profiles can make, on any name; the
    Namespace is the platform's. The claim counts only when the Namespace agrees: its
    `mlcluster.io/owner` annotation or Kubeflow's owner annotation names the Profile's owner,
    and no `mlcluster.io/owner` annotation names someone else (that one always wins). The
    Profile's own status is never asked: it is the claimant's to forge."""
    name, owner = profile["metadata"]["name"], profile_owner(profile)
    if owner is None:
        return f"Profile {name!r} names no user as its owner"
    if namespace is None:
        return f"namespace {name!r} of Profile {name!r} does not exist (yet)"
    annotations = (namespace.get("metadata") or {}).get("annotations") or {}
    marked = annotations.get(OWNER_ANNOTATION)
    if marked and marked != owner:
        return (
            f"namespace {name!r} belongs to {marked!r} (its {OWNER_ANNOTATION} annotation), "
            f"not to {owner!r}, the owner Profile {name!r} claims"
        )
    if marked == owner or annotations.get(KUBEFLOW_OWNER_ANNOTATION) == owner:
        return None
    found = annotations.get(KUBEFLOW_OWNER_ANNOTATION)
    said = (
        f"its {KUBEFLOW_OWNER_ANNOTATION!r} annotation names {found!r}"
        if found
        else (f"it has no {KUBEFLOW_OWNER_ANNOTATION!r} annotation")
    )
    return (
        f"namespace {name!r} existed before Profile {name!r} and was not given to {owner!r} "
        f"({said})"
    )


def validate_notebook_name(name: str) -> None:
    error = notebook_name_error(name)
    if error:
        raise InvalidNotebook(error)


def url_prefix(namespace: str, name: str) -> str:
    """The notebook's base URL path without the trailing slash (NB_PREFIX)."""
    return f"/notebook/{namespace}/{name}"


def _prefix_of(notebook: Mapping[str, Any]) -> str:
    return url_prefix(notebook["metadata"]["namespace"], notebook["metadata"]["name"])


def notebook_url(namespace: str, name: str) -> str:
    return url_prefix(namespace, name) + "/"


def is_stopped(notebook: Mapping[str, Any]) -> bool:
    return ANNOTATION_STOPPED in (notebook["metadata"].get("annotations") or {})


def rfc3339(moment: datetime.datetime) -> str:
    return moment.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def stop_patch(now: datetime.datetime) -> dict[str, Any]:
    """Merge patch that stops a notebook (what culling and the stop route apply)."""
    return {"metadata": {"annotations": {ANNOTATION_STOPPED: rfc3339(now)}}}


def start_patch() -> dict[str, Any]:
    return {"metadata": {"annotations": {ANNOTATION_STOPPED: None}}}


_STOPPED_POINTER = "/metadata/annotations/" + ANNOTATION_STOPPED.replace("~", "~0").replace(
    "/", "~1"
)


def guarded_stop_patch(
    notebook: Mapping[str, Any], stopped: bool, now: datetime.datetime
) -> list[dict[str, Any]]:
    """JSON patch (RFC 6902) that stops or starts exactly the notebook that was read: `test`
    ops on its uid and resourceVersion fail (422) when it was replaced or changed meanwhile,
    so a decision taken on one object is never applied to another of the same name."""
    meta = notebook["metadata"]
    ops: list[dict[str, Any]] = [
        {"op": "test", "path": "/metadata/uid", "value": meta["uid"]},
        {"op": "test", "path": "/metadata/resourceVersion", "value": meta["resourceVersion"]},
    ]
    annotations = meta.get("annotations") or {}
    if stopped:
        if "annotations" not in meta or meta["annotations"] is None:
            ops.append(
                {
                    "op": "add",
                    "path": "/metadata/annotations",
                    "value": {ANNOTATION_STOPPED: rfc3339(now)},
                }
            )
        else:
            ops.append({"op": "add", "path": _STOPPED_POINTER, "value": rfc3339(now)})
    elif ANNOTATION_STOPPED in annotations:
        ops.append({"op": "remove", "path": _STOPPED_POINTER})
    return ops


# --- the Notebook itself (for the spawning API) ---------------------------------------------


def _quantity(value: Any, pattern: re.Pattern[str], what: str) -> str:
    text = str(value).strip()
    if not pattern.fullmatch(text):
        raise InvalidNotebook(
            f"{what} must be a Kubernetes quantity such as "
            f"{'2 or 500m' if what == 'cpu' else '4Gi'} (got {value!r})"
        )
    return text


def notebook_resource(
    name: str,
    namespace: str,
    owner: str,
    image: str | None = None,
    cpu: str | float | None = None,
    memory: str | None = None,
    gpus: int = 0,
    workspace_size: str | None = None,
    *,
    storage_class: str | None = None,
    env: Mapping[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A Notebook for one user, from the spawn form's fields; raises InvalidNotebook."""
    validate_notebook_name(name)
    problem = owner_error(owner)
    if problem:
        raise InvalidNotebook(problem)
    if not isinstance(gpus, int) or isinstance(gpus, bool) or gpus < 0:
        raise InvalidNotebook(f"gpus must be a whole number >= 0 (got {gpus!r})")
    requests: dict[str, str] = {}
    limits: dict[str, str] = {}
    if cpu is not None:
        requests["cpu"] = _quantity(cpu, _CPU_RE, "cpu")
    if memory is not None:
        requests["memory"] = limits["memory"] = _quantity(memory, _MEMORY_RE, "memory")
    if gpus:
        limits["nvidia.com/gpu"] = str(gpus)
    container: dict[str, Any] = {"name": "notebook"}
    if image:
        container["image"] = image
    if requests or limits:
        container["resources"] = {
            k: v for k, v in (("requests", requests), ("limits", limits)) if v
        }
    if env:
        container["env"] = [{"name": k, "value": str(v)} for k, v in env.items()]
    spec: dict[str, Any] = {"owner": owner, "template": {"spec": {"containers": [container]}}}
    if workspace_size is not None:
        spec["workspace"] = {
            "size": _quantity(workspace_size, _WORKSPACE_SIZE_RE, "workspace size")
        }
        if storage_class:
            spec["workspace"]["storageClassName"] = storage_class
    metadata: dict[str, Any] = {"name": name, "namespace": namespace}
    if labels:
        metadata["labels"] = dict(labels)
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": metadata, "spec": spec}


# --- what the REST API and the sidebar show ---------------------------------------------------


def notebook_status_summary(obj: Mapping[str, Any]) -> dict[str, Any]:
    """What the REST API and the sidebar show about one Notebook."""
    meta = obj["metadata"]
    status = obj.get("status") or {}
    spec = obj.get("spec") or {}
    container = ((spec.get("template") or {}).get("spec") or {}).get("containers", [{}])[0]
    resources = container.get("resources") or {}
    stopped = is_stopped(obj)
    deleting = bool(meta.get("deletionTimestamp"))
    phase = (
        "deleting" if deleting else status.get("phase") or ("stopped" if stopped else "starting")
    )
    return {
        "name": meta["name"],
        "namespace": meta["namespace"],
        "owner": spec.get("owner"),
        "phase": phase,
        "ready": bool(status.get("ready")) and not stopped,
        "stopped": stopped,
        "url": status.get("url") or notebook_url(meta["namespace"], meta["name"]),
        "message": status.get("message", "waiting for the controller"),
        "created": meta.get("creationTimestamp"),
        "last_activity": status.get("lastActivity"),
        "image": container.get("image"),
        "cpu": (resources.get("requests") or {}).get("cpu"),
        "memory": (resources.get("requests") or {}).get("memory"),
        "gpus": int((resources.get("limits") or {}).get("nvidia.com/gpu", 0)),
        "workspace_size": (spec.get("workspace") or {}).get("size"),
    }
