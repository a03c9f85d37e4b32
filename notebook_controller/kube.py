"""The controller's own Kubernetes calls, over the asyncio ``kubernetes.aio`` client.

The typed API classes need a class per kind; the notebook's children span core, apps and two
Istio groups at versions found at runtime, so this wraps the client's transport (auth, TLS,
kubeconfig/in-cluster config, connection pool) with plain-dict REST by kind.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from kubernetes.aio import client, config

PLURALS = {
    "Notebook": "notebooks",
    "StatefulSet": "statefulsets",
    "Service": "services",
    "PersistentVolumeClaim": "persistentvolumeclaims",
    "Pod": "pods",
    "Event": "events",
    "VirtualService": "virtualservices",
    "AuthorizationPolicy": "authorizationpolicies",
}
MERGE_PATCH = "application/merge-patch+json"


class ApiError(Exception):
    def __init__(self, status: int, body: Any) -> None:
        self.status = status
        self.reason = body.get("reason", "") if isinstance(body, dict) else ""
        self.message = body.get("message", str(body)) if isinstance(body, dict) else str(body)
        super().__init__(f"{status} {self.reason}: {self.message}")


def object_path(
    api_version: str,
    kind: str,
    namespace: str | None,
    name: str | None = None,
    subresource: str | None = None,
) -> str:
    path = f"/apis/{api_version}" if "/" in api_version else f"/api/{api_version}"
    if namespace:
        path += f"/namespaces/{namespace}"
    path += f"/{PLURALS[kind]}"
    if name:
        path += f"/{name}"
    if subresource:
        path += f"/{subresource}"
    return path


async def load_configuration(kubeconfig: str = "") -> client.Configuration:
    """A kubeconfig file (given, or $KUBECONFIG) or else the in-cluster service account."""
    configuration = client.Configuration()
    path = kubeconfig or os.environ.get("KUBECONFIG", "")
    if path or "KUBERNETES_SERVICE_HOST" not in os.environ:
        await config.load_kube_config(config_file=path or None, client_configuration=configuration)
    else:
        config.load_incluster_config(client_configuration=configuration)
    return configuration


class KubeClient:
    def __init__(self, api: client.ApiClient) -> None:
        self.api = api

    @classmethod
    async def connect(cls, kubeconfig: str = "", connections: int = 32) -> KubeClient:
        configuration = await load_configuration(kubeconfig)
        configuration.connection_pool_maxsize = connections
        api = client.ApiClient(configuration)
        api.user_agent = "mlcluster-notebook-controller"
        return cls(api)

    async def close(self) -> None:
        await self.api.close()

    async def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        params: Mapping[str, str] | None = None,
        content_type: str = "application/json",
    ) -> Any:
        method_, url, headers, payload, post = await self.api.param_serialize(
            method,
            path,
            query_params=list((params or {}).items()),
            header_params={"Content-Type": content_type, "Accept": "application/json"},
            body=body,
            auth_settings=["BearerToken"],
        )
        response = await self.api.call_api(method_, url, headers, payload, post)
        data = await response.read()
        try:
            decoded = json.loads(data) if data else None
        except ValueError:
            decoded = data.decode("utf-8", "replace")
        if response.status >= 400:
            raise ApiError(response.status, decoded)
        return decoded

    async def get(
        self, api_version: str, kind: str, namespace: str | None, name: str
    ) -> dict[str, Any] | None:
        try:
            return await self.request("GET", object_path(api_version, kind, namespace, name))
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    async def create(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        meta = obj["metadata"]
        return await self.request(
            "POST", object_path(obj["apiVersion"], obj["kind"], meta.get("namespace")), dict(obj)
        )

    async def patch(
        self,
        api_version: str,
        kind: str,
        namespace: str | None,
        name: str,
        patch: Mapping[str, Any],
        subresource: str | None = None,
    ) -> dict[str, Any]:
        return await self.request(
            "PATCH",
            object_path(api_version, kind, namespace, name, subresource),
            dict(patch),
            content_type=MERGE_PATCH,
        )

    async def delete(
        self,
        api_version: str,
        kind: str,
        namespace: str | None,
        name: str,
        propagation: str = "Background",
    ) -> None:
        try:
            await self.request(
                "DELETE",
                object_path(api_version, kind, namespace, name),
                {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": propagation},
            )
        except ApiError as exc:
            if exc.status != 404:
                raise

    async def served_versions(self, group: str) -> list[str]:
        """Versions of an API group the server serves, preferred first ([] when absent)."""
        try:
            doc = await self.request("GET", f"/apis/{group}")
        except ApiError as exc:
            if exc.status == 404:
                return []
            raise
        preferred = doc.get("preferredVersion", {}).get("version")
        versions = [v["version"] for v in doc.get("versions", [])]
        return sorted(versions, key=lambda v: v != preferred)
