"""Per-user notebook servers: the calling user's `Notebook` objects (notebooks.mlcluster.io).

`NotebookService` is what the REST handlers call (synchronously, from the server's
executor). Without a Kubernetes cluster every call raises `ClusterUnavailable` (503 with
the reason); with one, it manages the user's Notebook custom objects, which the
notebook-controller turns into a StatefulSet, Service and Istio routes. Objects are built
by the pure functions at the top; the class below them is the only code that talks to the
API server.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import os
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

GROUP = "mlcluster.io"
VERSION = "v1alpha1"
PLURAL = "notebooks"
KIND = "Notebook"
STOPPED_ANNOTATION = "mlcluster.io/stopped"
OWNER_LABEL = "mlcluster.io/owner"
SERVICE_ACCOUNT_TOKEN = "/var/run/secrets/kubernetes.io/serviceaccount/token"
SERVICE_ACCOUNT_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
NO_CLUSTER = "no Kubernetes cluster is configured"


class ClusterUnavailable(RuntimeError):
    """No usable Kubernetes cluster; the message says why and starts with NO_CLUSTER."""


class NotebookNotFound(KeyError):
    def __str__(self) -> str:
        return f"you have no notebook server named {self.args[0]!r}"


class NotebookExists(RuntimeError):
    pass


class KubernetesApiError(RuntimeError):
    """The API server refused a request (e.g. RBAC); the message carries its reason."""


# -- pure builders ---------------------------------------------------------------------------


def owner_label(user: str) -> str:
    """A label value for a user name (labels allow 63 chars of [A-Za-z0-9-_.]); the exact
    owner is spec.owner, the label only narrows the list query."""
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "-", user).strip("-_.")[:40]
    digest = hashlib.sha256(user.encode()).hexdigest()[:10]
    return f"{slug}-{digest}" if slug else digest


def notebook_object(
    *, name: str, namespace: str, owner: str, image: str, request: dict[str, Any]
) -> dict[str, Any]:
    """A Notebook custom object for a validated NotebookRequest."""
    limits: dict[str, str] = {}
    if "cpus" in request:
        limits["cpu"] = f"{request['cpus']:g}"
    if "memory" in request:
        limits["memory"] = request["memory"]
    if request.get("gpus"):
        limits["nvidia.com/gpu"] = str(request["gpus"])
    container: dict[str, Any] = {"name": "notebook", "image": image}
    if limits:
        container["resources"] = {"requests": dict(limits), "limits": dict(limits)}
    spec: dict[str, Any] = {"owner": owner, "template": {"spec": {"containers": [container]}}}
    if request.get("workspace_size"):
        spec["workspace"] = {"size": request["workspace_size"]}
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KIND,
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {OWNER_LABEL: owner_label(owner)},
        },
        "spec": spec,
    }


def notebook_json(obj: dict[str, Any]) -> dict[str, Any]:
    """A Notebook custom object -> the REST shape."""
    meta = obj.get("metadata", {})
    spec = obj.get("spec", {})
    status = obj.get("status") or {}
    annotations = meta.get("annotations") or {}
    containers = spec.get("template", {}).get("spec", {}).get("containers") or [{}]
    name, namespace = meta.get("name", ""), meta.get("namespace", "")
    stopped = STOPPED_ANNOTATION in annotations
    return {
        "name": name,
        "namespace": namespace,
        "owner": spec.get("owner"),
        "image": containers[0].get("image"),
        "phase": status.get("phase") or ("Stopped" if stopped else "Pending"),
        "ready": bool(status.get("readyReplicas")),
        "stopped": stopped,
        "url": status.get("url") or f"/notebook/{namespace}/{name}/",
        "created": meta.get("creationTimestamp"),
        "conditions": list(status.get("conditions") or []),
    }


def rfc3339_now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def kubeconfig_files() -> list[str]:
    """The kubeconfig files in use ($KUBECONFIG, else ~/.kube/config) that exist. Read at
    each call: the kubernetes package reads $KUBECONFIG only once, when imported."""
    paths = [p for p in os.environ.get("KUBECONFIG", "~/.kube/config").split(os.pathsep) if p]
    return [str(Path(p).expanduser()) for p in paths if Path(p).expanduser().is_file()]


def in_cluster() -> bool:
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST")) and Path(SERVICE_ACCOUNT_TOKEN).exists()


def kubernetes_problem() -> str | None:
    """Why this server cannot reach a Kubernetes cluster, or None if it can try."""
    if in_cluster():
        return None
    files = kubeconfig_files()
    if not files:
        where = os.environ.get("KUBECONFIG") or "~/.kube/config"
        return f"{NO_CLUSTER}: this server is not running in a cluster and has no kubeconfig ({where} not found)"
    try:
        from kubernetes import client, config

        config.load_kube_config(
            config_file=os.pathsep.join(files), client_configuration=client.Configuration()
        )
    except Exception as exc:  # noqa: BLE001 - any reason the kubeconfig is unusable
        return f"{NO_CLUSTER}: the kubeconfig {os.pathsep.join(files)} cannot be used ({exc})"
    return None


# -- the service -------------------------------------------------------------------------------


class NotebookService:
    """The calling user's notebook servers. Blocking: call from an executor thread."""

    PROBE_TTL = 10.0

    def __init__(self, *, namespace: str, image: str):
        self.namespace = namespace
        self.image = image
        self._lock = threading.Lock()
        self._probed = 0.0
        self._problem: str | None = None
        self._api = None

    def _custom_objects(self):
        """The CustomObjectsApi, or ClusterUnavailable. Re-probes now and then, so a cluster
        configured after the server started is picked up."""
        with self._lock:
            if time.monotonic() - self._probed > self.PROBE_TTL:
                self._probed = time.monotonic()
                self._problem = kubernetes_problem()
                self._api = None
            if self._problem:
                raise ClusterUnavailable(self._problem)
            if self._api is None:
                from kubernetes import client, config

                configuration = client.Configuration()
                if in_cluster():
                    config.load_incluster_config(client_configuration=configuration)
                else:
                    config.load_kube_config(
                        config_file=os.pathsep.join(kubeconfig_files()),
                        client_configuration=configuration,
                    )
                self._api = client.CustomObjectsApi(client.ApiClient(configuration))
            return self._api

    @contextlib.contextmanager
    def _api_errors(self) -> Iterator[None]:
        """API failures -> this module's errors (404/409 stay with the callers that expect them)."""
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        try:
            yield
        except ApiException as exc:
            if exc.status == 404:
                raise
            if exc.status == 409:
                raise
            raise KubernetesApiError(
                f"the Kubernetes API refused the request: {exc.status} {exc.reason}"
            ) from None
        except (HTTPError, OSError) as exc:
            self._probed = 0.0  # look again next time
            raise ClusterUnavailable(
                f"the Kubernetes API server cannot be reached: {exc}"
            ) from None

    def _namespace(self) -> str:
        """The configured namespace, else this pod's, else the kubeconfig context's, else 'default'."""
        if self.namespace:
            return self.namespace
        if in_cluster():
            with contextlib.suppress(OSError):
                return Path(SERVICE_ACCOUNT_NAMESPACE).read_text().strip()
        with contextlib.suppress(Exception):
            from kubernetes import config

            _, active = config.list_kube_config_contexts(
                config_file=os.pathsep.join(kubeconfig_files())
            )
            if active and active.get("context", {}).get("namespace"):
                return active["context"]["namespace"]
        return "default"

    def _get_owned(self, user: str, name: str) -> dict[str, Any]:
        from kubernetes.client.exceptions import ApiException

        api = self._custom_objects()
        try:
            with self._api_errors():
                obj = api.get_namespaced_custom_object(
                    GROUP, VERSION, self._namespace(), PLURAL, name
                )
        except ApiException:  # 404: _api_errors passes only that and 409 through
            raise NotebookNotFound(name) from None
        if obj.get("spec", {}).get("owner") != user:
            raise NotebookNotFound(name)  # someone else's: as if it did not exist
        return obj

    def list(self, user: str) -> list[dict[str, Any]]:
        api = self._custom_objects()
        with self._api_errors():
            found = api.list_namespaced_custom_object(
                GROUP,
                VERSION,
                self._namespace(),
                PLURAL,
                label_selector=f"{OWNER_LABEL}={owner_label(user)}",
            )
        return [
            notebook_json(o)
            for o in found.get("items", [])
            if o.get("spec", {}).get("owner") == user
        ]

    def get(self, user: str, name: str) -> dict[str, Any]:
        return notebook_json(self._get_owned(user, name))

    def create(self, user: str, request: dict[str, Any]) -> dict[str, Any]:
        from kubernetes.client.exceptions import ApiException

        api = self._custom_objects()
        image = request.get("image") or self.image
        if not image:
            raise ValueError("image: no image given and no default (MLClusterApp.notebook_image)")
        namespace = self._namespace()
        body = notebook_object(
            name=request["name"], namespace=namespace, owner=user, image=image, request=request
        )
        try:
            with self._api_errors():
                created = api.create_namespaced_custom_object(
                    GROUP, VERSION, namespace, PLURAL, body
                )
        except ApiException as exc:
            if exc.status == 409:
                raise NotebookExists(
                    f"a notebook server named {request['name']!r} exists"
                ) from None
            raise KubernetesApiError(
                f"the Kubernetes API refused the request: {exc.status} {exc.reason}"
            ) from None
        return notebook_json(created)

    def delete(self, user: str, name: str) -> None:
        from kubernetes.client.exceptions import ApiException

        self._get_owned(user, name)
        try:
            with self._api_errors():
                self._custom_objects().delete_namespaced_custom_object(
                    GROUP, VERSION, self._namespace(), PLURAL, name, propagation_policy="Foreground"
                )
        except ApiException:
            pass  # 404 (gone meanwhile) or 409 (already being deleted): deleted either way

    def stop(self, user: str, name: str) -> dict[str, Any]:
        return self._annotate(user, name, rfc3339_now())

    def start(self, user: str, name: str) -> dict[str, Any]:
        return self._annotate(user, name, None)

    def _annotate(self, user: str, name: str, stopped: str | None) -> dict[str, Any]:
        from kubernetes.client.exceptions import ApiException

        obj = self._get_owned(user, name)
        if (STOPPED_ANNOTATION in (obj["metadata"].get("annotations") or {})) == (
            stopped is not None
        ):
            return notebook_json(obj)  # already stopped / running: keep the original time
        patch = {
            "metadata": {"annotations": {STOPPED_ANNOTATION: stopped}}
        }  # merge patch; None removes it
        try:
            with self._api_errors():
                patched = self._custom_objects().patch_namespaced_custom_object(
                    GROUP, VERSION, self._namespace(), PLURAL, name, patch
                )
        except ApiException:
            raise NotebookNotFound(name) from None
        return notebook_json(patched)
