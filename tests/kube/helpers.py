"""What tests do to a cluster besides being its client: install CRDs, play kubelet/controllers.

Everything goes through the API over HTTP, as a kubelet or an operator would, except pod log
text and etcd compaction, which have no API (those call into the emulator's loop directly).
"""

from __future__ import annotations

import copy
import datetime
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import requests

from ..helpers import wait_for
from .emulator import EmulatorThread, RealisticKubernetes

T = TypeVar("T")
MERGE = "application/merge-patch+json"


class KubeApiError(Exception):
    def __init__(self, status: int, body: Any) -> None:
        message = body.get("message") if isinstance(body, dict) else body
        super().__init__(f"{status}: {message}")
        self.status, self.body = status, body

    @property
    def reason(self) -> str | None:
        return self.body.get("reason") if isinstance(self.body, dict) else None


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Kube:
    """A small generic REST client for any kind (built-ins and CRs) plus test-side roles."""

    def __init__(self, url: str, thread: EmulatorThread | None = None) -> None:
        self.url = url.rstrip("/")
        self.thread = thread
        self.http = requests.Session()
        self.http.headers["Authorization"] = "Bearer emulator-token"
        self._plurals: dict[tuple[str, str], tuple[str, bool]] = {}

    # -- generic REST ----------------------------------------------------------------------
    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        params: Mapping[str, Any] | None = None,
        content_type: str = "application/json",
    ) -> Any:
        response = self.http.request(
            method,
            self.url + path,
            params=params,
            json=body,
            headers={"Content-Type": content_type},
            timeout=30,
        )
        data = (
            response.json()
            if response.headers.get("Content-Type", "").startswith("application/json")
            else response.text
        )
        if response.status_code >= 400:
            raise KubeApiError(response.status_code, data)
        return data

    def resource(self, api_version: str, kind: str) -> tuple[str, bool]:
        """(plural, namespaced) of a kind, from API discovery (refreshed on a miss)."""
        if (api_version, kind) not in self._plurals:
            prefix = f"/apis/{api_version}" if "/" in api_version else f"/api/{api_version}"
            for entry in self.request("GET", prefix)["resources"]:
                if "/" not in entry["name"]:
                    self._plurals[(api_version, entry["kind"])] = (
                        entry["name"],
                        entry["namespaced"],
                    )
        if (api_version, kind) not in self._plurals:
            raise KubeApiError(404, f"{kind} is not served at {api_version}")
        return self._plurals[(api_version, kind)]

    def path(
        self,
        api_version: str,
        kind: str,
        namespace: str | None = None,
        name: str | None = None,
        subresource: str | None = None,
    ) -> str:
        plural, namespaced = self.resource(api_version, kind)
        path = f"/apis/{api_version}" if "/" in api_version else f"/api/{api_version}"
        if namespaced and namespace:
            path += f"/namespaces/{namespace}"
        path += f"/{plural}"
        if name:
            path += f"/{name}"
        if subresource:
            path += f"/{subresource}"
        return path

    def create(self, obj: Mapping[str, Any], namespace: str | None = None) -> dict[str, Any]:
        namespace = namespace or obj.get("metadata", {}).get("namespace")
        return self.request("POST", self.path(obj["apiVersion"], obj["kind"], namespace), dict(obj))

    def get(
        self, api_version: str, kind: str, name: str, namespace: str | None = None
    ) -> dict[str, Any]:
        return self.request("GET", self.path(api_version, kind, namespace, name))

    def find(
        self, api_version: str, kind: str, name: str, namespace: str | None = None
    ) -> dict[str, Any] | None:
        try:
            return self.get(api_version, kind, name, namespace)
        except KubeApiError as exc:
            if exc.status == 404:
                return None
            raise

    def list(
        self,
        api_version: str,
        kind: str,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> list[dict[str, Any]]:
        params = {
            k: v
            for k, v in {"labelSelector": label_selector, "fieldSelector": field_selector}.items()
            if v
        }
        return self.request("GET", self.path(api_version, kind, namespace), params=params)["items"]

    def patch(
        self,
        api_version: str,
        kind: str,
        name: str,
        patch: Any,
        namespace: str | None = None,
        *,
        subresource: str | None = None,
        content_type: str = MERGE,
    ) -> dict[str, Any]:
        return self.request(
            "PATCH",
            self.path(api_version, kind, namespace, name, subresource),
            patch,
            content_type=content_type,
        )

    def replace(self, obj: Mapping[str, Any], *, subresource: str | None = None) -> dict[str, Any]:
        meta = obj["metadata"]
        return self.request(
            "PUT",
            self.path(
                obj["apiVersion"], obj["kind"], meta.get("namespace"), meta["name"], subresource
            ),
            dict(obj),
        )

    def delete(
        self,
        api_version: str,
        kind: str,
        name: str,
        namespace: str | None = None,
        *,
        propagation: str | None = None,
    ) -> dict[str, Any]:
        body = {"kind": "DeleteOptions", "apiVersion": "v1"}
        if propagation:
            body["propagationPolicy"] = propagation
        return self.request("DELETE", self.path(api_version, kind, namespace, name), body)

    def wait_for(
        self,
        predicate: Callable[[], T],
        timeout: float = 10,
        interval: float = 0.05,
        message: str = "condition",
    ) -> T:
        return wait_for(predicate, timeout, interval, message, error=TimeoutError)

    # -- cluster setup ---------------------------------------------------------------------
    def create_namespace(
        self, name: str, labels: Mapping[str, str] | None = None
    ) -> dict[str, Any]:
        return self.create(
            {
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {"name": name, "labels": dict(labels or {})},
            }
        )

    def install_crd(self, crd: Mapping[str, Any]) -> dict[str, Any]:
        """Create (or replace) a CRD and wait until it is established and discoverable."""
        name = crd["metadata"]["name"]
        api = "apiextensions.k8s.io/v1"
        existing = self.find(api, "CustomResourceDefinition", name)
        if existing is None:
            self.create(crd)
        else:
            body = copy.deepcopy(dict(crd))
            body["metadata"] = {
                **body["metadata"],
                "resourceVersion": existing["metadata"]["resourceVersion"],
            }
            self.replace(body)
        self._plurals.clear()
        group = crd["spec"]["group"]
        served = [v["name"] for v in crd["spec"]["versions"] if v.get("served", True)]
        self.wait_for(
            lambda: all(self._served(group, v, crd["spec"]["names"]["plural"]) for v in served),
            message=f"CRD {name} to be served",
        )
        return self.get(api, "CustomResourceDefinition", name)

    def uninstall_crd(self, name: str) -> None:
        try:
            self.delete("apiextensions.k8s.io/v1", "CustomResourceDefinition", name)
        except KubeApiError as exc:
            if exc.status != 404:
                raise
        self._plurals.clear()

    def _served(self, group: str, version: str, plural: str) -> bool:
        try:
            doc = self.request("GET", f"/apis/{group}/{version}")
        except KubeApiError:
            return False
        return any(entry["name"] == plural for entry in doc["resources"])

    # -- playing kubelet -------------------------------------------------------------------
    def set_pod_phase(
        self,
        namespace: str,
        name: str,
        phase: str,
        *,
        ready: bool | None = None,
        exit_code: int = 0,
        reason: str | None = None,
        message: str | None = None,
        pod_ip: str = "10.244.0.10",
    ) -> dict[str, Any]:
        """Report a pod's phase as a kubelet would: Running (ready), Succeeded or Failed."""
        pod = self.get("v1", "Pod", name, namespace)
        ready = (phase == "Running") if ready is None else ready
        now = _now()
        statuses = []
        for container in pod["spec"]["containers"]:
            if phase == "Running":
                state: dict[str, Any] = {"running": {"startedAt": now}}
            elif phase in ("Succeeded", "Failed"):
                code = exit_code if phase == "Failed" else 0
                state = {
                    "terminated": {
                        "exitCode": code or (1 if phase == "Failed" else 0),
                        "reason": reason or ("Completed" if phase == "Succeeded" else "Error"),
                        "startedAt": now,
                        "finishedAt": now,
                    }
                }
            else:
                state = {"waiting": {"reason": reason or "ContainerCreating"}}
            statuses.append(
                {
                    "name": container["name"],
                    "image": container["image"],
                    "imageID": f"docker.io/{container['image']}@sha256:0",
                    "ready": ready,
                    "restartCount": 0,
                    "started": phase == "Running",
                    "state": state,
                }
            )
        conditions = [
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": now},
            {"type": "Initialized", "status": "True", "lastTransitionTime": now},
            {"type": "ContainersReady", "status": str(ready), "lastTransitionTime": now},
            {"type": "Ready", "status": str(ready), "lastTransitionTime": now},
        ]
        status = {
            "phase": phase,
            "conditions": conditions,
            "containerStatuses": statuses,
            "hostIP": "10.0.0.1",
            "podIP": pod_ip,
            "startTime": now,
        }
        if message:
            status["message"] = message
        if reason and phase in ("Failed", "Pending"):
            status["reason"] = reason
        return self.patch("v1", "Pod", name, {"status": status}, namespace, subresource="status")

    def set_pod_unschedulable(
        self,
        namespace: str,
        name: str,
        message: str = "0/3 nodes are available: 3 Insufficient nvidia.com/gpu.",
    ) -> dict[str, Any]:
        """What the scheduler reports for a pod it cannot place."""
        status = {
            "phase": "Pending",
            "conditions": [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": message,
                    "lastTransitionTime": _now(),
                }
            ],
        }
        return self.patch("v1", "Pod", name, {"status": status}, namespace, subresource="status")

    def set_container_waiting(
        self, namespace: str, name: str, reason: str, message: str = ""
    ) -> dict[str, Any]:
        """A scheduled pod whose containers cannot start (ImagePullBackOff, CrashLoopBackOff...)."""
        pod = self.get("v1", "Pod", name, namespace)
        statuses = [
            {
                "name": c["name"],
                "image": c["image"],
                "imageID": "",
                "ready": False,
                "restartCount": 0,
                "started": False,
                "state": {"waiting": {"reason": reason, "message": message}},
            }
            for c in pod["spec"]["containers"]
        ]
        status = {
            "phase": "Pending",
            "containerStatuses": statuses,
            "conditions": [
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": _now()},
                {
                    "type": "Ready",
                    "status": "False",
                    "reason": "ContainersNotReady",
                    "lastTransitionTime": _now(),
                },
            ],
        }
        return self.patch("v1", "Pod", name, {"status": status}, namespace, subresource="status")

    def record_event(
        self,
        involved: Mapping[str, Any],
        reason: str,
        message: str,
        *,
        type: str = "Normal",
        component: str = "kubelet",
    ) -> dict[str, Any]:
        """Post a core/v1 Event about an object, as the scheduler or kubelet would."""
        meta = involved["metadata"]
        now = _now()
        return self.create(
            {
                "apiVersion": "v1",
                "kind": "Event",
                "metadata": {
                    "generateName": f"{meta['name']}.",
                    "namespace": meta.get("namespace", "default"),
                },
                "involvedObject": {
                    "apiVersion": involved["apiVersion"],
                    "kind": involved["kind"],
                    "name": meta["name"],
                    "namespace": meta.get("namespace"),
                    "uid": meta["uid"],
                    "resourceVersion": meta.get("resourceVersion"),
                },
                "reason": reason,
                "message": message,
                "type": type,
                "count": 1,
                "source": {"component": component},
                "firstTimestamp": now,
                "lastTimestamp": now,
                "reportingComponent": component,
                "reportingInstance": "",
            }
        )

    # -- playing controllers ---------------------------------------------------------------
    def run_statefulset(
        self, namespace: str, name: str, *, ready: bool = True
    ) -> list[dict[str, Any]]:
        """One pass of the StatefulSet controller + kubelet: pods per spec.replicas, status set."""
        sts = self.get("apps/v1", "StatefulSet", name, namespace)
        replicas = sts["spec"].get("replicas", 1)
        template = sts["spec"]["template"]
        owner = {
            "apiVersion": "apps/v1",
            "kind": "StatefulSet",
            "name": name,
            "uid": sts["metadata"]["uid"],
            "controller": True,
            "blockOwnerDeletion": True,
        }
        pods = []
        for ordinal in range(replicas):
            pod_name = f"{name}-{ordinal}"
            pod = self.find("v1", "Pod", pod_name, namespace)
            if pod is None:
                labels = {
                    **template.get("metadata", {}).get("labels", {}),
                    "statefulset.kubernetes.io/pod-name": pod_name,
                    "apps.kubernetes.io/pod-index": str(ordinal),
                }
                pod = self.create(
                    {
                        "apiVersion": "v1",
                        "kind": "Pod",
                        "metadata": {
                            "name": pod_name,
                            "namespace": namespace,
                            "labels": labels,
                            "annotations": template.get("metadata", {}).get("annotations", {}),
                            "ownerReferences": [owner],
                        },
                        "spec": {
                            **template["spec"],
                            "hostname": pod_name,
                            "subdomain": sts["spec"].get("serviceName", name),
                        },
                    }
                )
            if ready:
                pod = self.set_pod_phase(namespace, pod_name, "Running")
            pods.append(pod)
        for pod in self.list("v1", "Pod", namespace, label_selector=self._selector(sts)):
            index = pod["metadata"].get("labels", {}).get("apps.kubernetes.io/pod-index")
            if index is not None and int(index) >= replicas:
                self.delete("v1", "Pod", pod["metadata"]["name"], namespace)
        count = len(pods)
        ready_count = count if ready else 0
        self.patch(
            "apps/v1",
            "StatefulSet",
            name,
            {
                "status": {
                    "observedGeneration": sts["metadata"].get("generation", 1),
                    "replicas": count,
                    "readyReplicas": ready_count,
                    "currentReplicas": count,
                    "updatedReplicas": count,
                    "availableReplicas": ready_count,
                }
            },
            namespace,
            subresource="status",
        )
        return pods

    @staticmethod
    def _selector(sts: Mapping[str, Any]) -> str:
        labels = sts["spec"]["selector"].get("matchLabels", {})
        return ",".join(f"{k}={v}" for k, v in labels.items())

    # -- things with no API ----------------------------------------------------------------
    def append_log(self, namespace: str, pod: str, text: str, container: str | None = None) -> None:
        """Append container output, as the container runtime would write it."""
        assert self.thread is not None, "log text needs the in-process emulator"
        self.thread.call(lambda e: e.append_log(namespace, pod, text, container))

    def compact(self) -> None:
        """An etcd compaction: watches from older resourceVersions get 410 Gone."""
        assert self.thread is not None
        self.thread.call(lambda e: e.compact())

    def on_emulator(self, fn: Callable[[RealisticKubernetes], T]) -> T:
        """Run fn(emulator) on the emulator's loop, e.g. to add a kmock reaction for a fault."""
        assert self.thread is not None
        return self.thread.call(fn)
