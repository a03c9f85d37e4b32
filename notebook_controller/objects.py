"""Pure builders: a Notebook in, the objects it owns out, and the patch that repairs drift.
No API calls here. (Its status is `status.py`'s, its events `events.py`'s.)

The Notebook resource itself (names, owner rules, ``notebook_resource``, the stop and start
patches) is `jupyterlab_mlcluster/notebook_resource.py`'s, shared with the server extension,
and named here too for the controller's modules.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from jupyterlab_mlcluster.jobs.owner import USER_ENV
from jupyterlab_mlcluster.notebook_resource import (  # noqa: F401 - the controller's names
    ANNOTATION_STOPPED,
    LABEL_MANAGED_BY,
    MANAGED_BY,
    MAX_NAME_LENGTH,
    InvalidNotebook,
    _prefix_of,
    guarded_stop_patch,
    is_stopped,
    namespace_error,
    notebook_name_error,
    notebook_resource,
    notebook_url,
    owner_error,
    rfc3339,
    start_patch,
    stop_patch,
    url_prefix,
    validate_notebook_name,
)

from .config import ControllerConfig
from .crd import API_VERSION, KIND

LABEL_NOTEBOOK = "mlcluster.io/notebook-name"
CONTAINER_PORT = 8888
SERVICE_PORT = 80
ISTIO_VERSIONS = ("v1", "v1beta1")  # newest first


def preferred_istio_version(served: Sequence[str]) -> str | None:
    """The newest Istio API version among those the cluster serves."""
    return next((version for version in ISTIO_VERSIONS if version in served), None)


@dataclass(frozen=True)
class IstioVersions:
    networking: str | None  # networking.istio.io version for VirtualService, None: not served
    security: str | None  # security.istio.io version for AuthorizationPolicy


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
