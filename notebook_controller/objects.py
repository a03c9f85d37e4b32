"""Pure builders: a Notebook in, the objects it owns out, and the patch that repairs drift.
No API calls here. (Its status is `status.py`'s, its events `events.py`'s.)

Also the helpers the server extension uses for per-user spawning: ``notebook_resource``,
``validate_notebook_name``, ``stop_patch``/``start_patch``.
"""

from __future__ import annotations

import copy
import datetime
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from jupyterlab_mlcluster import patterns
from jupyterlab_mlcluster.jobs.owner import USER_ENV

from .config import ControllerConfig
from .crd import API_VERSION, KIND

LABEL_NOTEBOOK = "mlcluster.io/notebook-name"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGED_BY = "mlcluster-notebook-controller"
ANNOTATION_STOPPED = "mlcluster.io/stopped"
CONTAINER_PORT = 8888
SERVICE_PORT = 80
MAX_NAME_LENGTH = 52  # the StatefulSet's pod gets '-0' and a controller-revision-hash label
ISTIO_VERSIONS = ("v1", "v1beta1")  # newest first

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
    return moment.astimezone(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


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


def preferred_istio_version(served: Sequence[str]) -> str | None:
    """The newest Istio API version among those the cluster serves."""
    return next((version for version in ISTIO_VERSIONS if version in served), None)


@dataclass(frozen=True)
class IstioVersions:
    networking: str | None  # networking.istio.io version for VirtualService, None: not served
    security: str | None  # security.istio.io version for AuthorizationPolicy


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


# --- owned objects ----------------------------------------------------------------------------


def selector_labels(name: str) -> dict[str, str]:
    return {LABEL_NOTEBOOK: name}


def object_labels(name: str) -> dict[str, str]:
    """The labels of everything made for a notebook (its selector, and who manages it)."""
    return {**selector_labels(name), LABEL_MANAGED_BY: MANAGED_BY}


def owner_reference(notebook: Mapping[str, Any]) -> dict[str, Any]:
    meta = notebook["metadata"]
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _metadata(notebook: Mapping[str, Any], name: str) -> dict[str, Any]:
    meta = notebook["metadata"]
    return {
        "name": name,
        "namespace": meta["namespace"],
        "labels": object_labels(meta["name"]),
        "ownerReferences": [owner_reference(notebook)],
    }


def workspace_claim_name(name: str) -> str:
    return f"{name}-workspace"


def _jupyter_container(
    container: dict[str, Any], prefix: str, config: ControllerConfig, owner: str = ""
) -> None:
    container.setdefault("image", config.default_image)
    container.setdefault("imagePullPolicy", config.image_pull_policy)
    ours = {"NB_PREFIX": prefix}
    if owner:
        # Jobs a kernel or the CLI submits in this pod belong to the notebook's owner (the
        # identity a header-trusting server scopes its job routes by), not to the image's
        # Unix user; the template's own value, if any, never wins (jobs/owner.py).
        ours[USER_ENV] = owner
    env = [e for e in container.get("env", []) if e.get("name") not in ours]
    container["env"] = [*({"name": k, "value": v} for k, v in ours.items()), *env]
    if "command" not in container and "args" not in container:
        # $(NB_PREFIX) is expanded by the kubelet from the container's env.
        container["command"] = ["jupyter", "lab"]
        container["args"] = [
            "--ip=0.0.0.0",
            f"--port={CONTAINER_PORT}",
            "--no-browser",
            "--ServerApp.base_url=$(NB_PREFIX)",
            "--IdentityProvider.token=",
            "--ServerApp.password=",
            "--ServerApp.trust_xheaders=True",
        ]
    ports = [p for p in container.get("ports", []) if p.get("containerPort") != CONTAINER_PORT]
    container["ports"] = [
        {"name": "notebook-port", "containerPort": CONTAINER_PORT, "protocol": "TCP"},
        *ports,
    ]
    container.setdefault(
        "readinessProbe",
        {
            "httpGet": {"path": f"{prefix}/api/status", "port": CONTAINER_PORT},
            "periodSeconds": 5,
            "failureThreshold": 3,
        },
    )


def statefulset(notebook: Mapping[str, Any], config: ControllerConfig) -> dict[str, Any]:
    meta, spec = notebook["metadata"], notebook["spec"]
    name, namespace = meta["name"], meta["namespace"]
    template = copy.deepcopy(spec["template"])
    pod_meta = template.get("metadata") or {}
    pod_spec = template["spec"]
    _jupyter_container(
        pod_spec["containers"][0], url_prefix(namespace, name), config, spec.get("owner") or ""
    )
    volumes = [v for v in pod_spec.get("volumes", []) if v.get("name") not in ("workspace", "dshm")]
    mounts = pod_spec["containers"][0].setdefault("volumeMounts", [])
    if spec.get("workspace"):
        volumes.append(
            {
                "name": "workspace",
                "persistentVolumeClaim": {"claimName": workspace_claim_name(name)},
            }
        )
        mount_path = spec["workspace"].get("mountPath") or config.workspace_mount_path
        mounts[:] = [m for m in mounts if m.get("name") != "workspace"]
        mounts.append({"name": "workspace", "mountPath": mount_path})
    if config.shm_size:
        volumes.append(
            {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": config.shm_size}}
        )
        mounts[:] = [m for m in mounts if m.get("name") != "dshm"]
        mounts.append({"name": "dshm", "mountPath": "/dev/shm"})
    if not mounts:
        del pod_spec["containers"][0]["volumeMounts"]
    if volumes:
        pod_spec["volumes"] = volumes
    if config.service_account and not pod_spec.get("serviceAccountName"):
        pod_spec["serviceAccountName"] = config.service_account
    # The images' user (jovyan, group 100) must be able to write the workspace volume.
    pod_spec.setdefault("securityContext", {}).setdefault("fsGroup", 100)
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": _metadata(notebook, name),
        "spec": {
            "replicas": 0 if is_stopped(notebook) else 1,
            "serviceName": name,
            "selector": {"matchLabels": selector_labels(name)},
            "template": {
                "metadata": {
                    "labels": {**(pod_meta.get("labels") or {}), **object_labels(name)},
                    **(
                        {"annotations": pod_meta["annotations"]}
                        if pod_meta.get("annotations")
                        else {}
                    ),
                },
                "spec": pod_spec,
            },
        },
    }


def service(notebook: Mapping[str, Any], config: ControllerConfig) -> dict[str, Any]:
    name = notebook["metadata"]["name"]
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(notebook, name),
        "spec": {
            "type": "ClusterIP",
            "selector": selector_labels(name),
            # The 'http-' name prefix tells Istio the protocol (websockets ride on HTTP/1.1).
            "ports": [
                {
                    "name": "http-notebook",
                    "port": SERVICE_PORT,
                    "targetPort": CONTAINER_PORT,
                    "protocol": "TCP",
                }
            ],
        },
    }


def virtual_service(
    notebook: Mapping[str, Any], config: ControllerConfig, api_version: str
) -> dict[str, Any]:
    meta = notebook["metadata"]
    name, namespace = meta["name"], meta["namespace"]
    prefix = url_prefix(namespace, name)
    # No route timeout: Istio upgrades websockets by default and a timeout would cut kernels.
    return {
        "apiVersion": f"networking.istio.io/{api_version}",
        "kind": "VirtualService",
        "metadata": _metadata(notebook, name),
        "spec": {
            "hosts": [config.host],
            "gateways": [config.gateway],
            "http": [
                {
                    "name": "notebook",
                    "match": [{"uri": {"prefix": prefix + "/"}}, {"uri": {"exact": prefix}}],
                    "rewrite": {"uri": prefix + "/"},
                    "route": [
                        {
                            "destination": {
                                "host": f"{name}.{namespace}.svc.cluster.local",
                                "port": {"number": SERVICE_PORT},
                            }
                        }
                    ],
                }
            ],
        },
    }


def authorization_policy(
    notebook: Mapping[str, Any], config: ControllerConfig, api_version: str
) -> dict[str, Any]:
    name, prefix = notebook["metadata"]["name"], _prefix_of(notebook)
    owner = config.owner_header_prefix + notebook["spec"]["owner"]
    return {
        "apiVersion": f"security.istio.io/{api_version}",
        "kind": "AuthorizationPolicy",
        "metadata": _metadata(notebook, name),
        "spec": {
            "action": "ALLOW",
            "selector": {"matchLabels": selector_labels(name)},
            "rules": [
                # The owner, through the gateway (which sets the identity header after login).
                {
                    "from": [{"source": {"principals": [config.gateway_principal]}}],
                    "when": [{"key": f"request.headers[{config.owner_header}]", "values": [owner]}],
                },
                # The controller, reading activity for culling (read-only endpoints).
                {
                    "from": [{"source": {"principals": [config.controller_principal]}}],
                    "to": [
                        {
                            "operation": {
                                "methods": ["GET"],
                                "paths": [
                                    f"{prefix}/api/status",
                                    f"{prefix}/api/kernels",
                                    f"{prefix}/api/terminals",
                                ],
                            }
                        }
                    ],
                },
            ],
        },
    }


def workspace_claim(notebook: Mapping[str, Any], config: ControllerConfig) -> dict[str, Any]:
    workspace = notebook["spec"]["workspace"]
    spec: dict[str, Any] = {
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": workspace["size"]}},
    }
    storage_class = workspace.get("storageClassName") or config.storage_class
    if storage_class:
        spec["storageClassName"] = storage_class
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": _metadata(notebook, workspace_claim_name(notebook["metadata"]["name"])),
        "spec": spec,
    }


def desired_children(
    notebook: Mapping[str, Any], config: ControllerConfig, istio: IstioVersions
) -> list[dict[str, Any]]:
    """Everything a Notebook owns, in creation order (the volume before the pod that needs it)."""
    children = []
    if notebook["spec"].get("workspace"):
        children.append(workspace_claim(notebook, config))
    children += [service(notebook, config), statefulset(notebook, config)]
    if config.use_istio and istio.networking:
        children.append(virtual_service(notebook, config, istio.networking))
    if config.use_istio and istio.security:
        children.append(authorization_policy(notebook, config, istio.security))
    return children


# --- drift ------------------------------------------------------------------------------------


def contains(actual: Any, desired: Any) -> bool:
    """Whether ``actual`` has everything ``desired`` sets (servers add defaults, never remove)."""
    if isinstance(desired, Mapping):
        return isinstance(actual, Mapping) and all(
            contains(actual.get(k), v) for k, v in desired.items()
        )
    if isinstance(desired, list):
        return (
            isinstance(actual, list)
            and len(actual) == len(desired)
            and all(contains(a, d) for a, d in zip(actual, desired, strict=True))
        )
    return actual == desired or (isinstance(actual, (int, float)) and str(actual) == str(desired))


# Per kind: the spec fields a repair may patch, and whether they must match exactly (security
# objects: an extra rule someone added is drift too) or only contain ours (server defaults).
_REPAIRABLE: dict[str, tuple[tuple[str, ...], bool]] = {
    "StatefulSet": (("replicas", "template"), False),
    "Service": (("selector", "ports", "type"), False),
    "VirtualService": (("hosts", "gateways", "http"), True),
    "AuthorizationPolicy": (("action", "selector", "rules"), True),
    "PersistentVolumeClaim": (("resources",), False),
}


def repair_patch(desired: Mapping[str, Any], actual: Mapping[str, Any]) -> dict[str, Any] | None:
    """The merge patch that puts ``actual`` back in shape, or None when it is fine."""
    patch: dict[str, Any] = {}
    labels = actual["metadata"].get("labels") or {}
    if not contains(labels, desired["metadata"]["labels"]):
        patch["metadata"] = {"labels": desired["metadata"]["labels"]}
    fields, exact = _REPAIRABLE[desired["kind"]]
    spec_patch = {}
    for field in fields:
        want, have = desired["spec"].get(field), (actual.get("spec") or {}).get(field)
        if want is not None and not (have == want if exact else contains(have, want)):
            spec_patch[field] = want
    if spec_patch:
        patch["spec"] = spec_patch
    return patch or None
