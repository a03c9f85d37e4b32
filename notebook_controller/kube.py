"""The controller's own Kubernetes calls: plain-dict REST by kind over the asyncio client.

The typed API classes need a class per kind; the notebook's children span core, apps and two
Istio groups at versions found at runtime. The connection (configuration, errors, retry
policy) is `jupyterlab_mlcluster.kubeconn`'s; this adds the kinds the controller touches.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from jupyterlab_mlcluster.kubeconn import (
    MERGE_PATCH,
    AsyncConnection,
    FailureLog,
    KubeError,
    call_async,
    load_config_async,
    resource_path,
)

if TYPE_CHECKING:
    import kopf

from .metrics import count_api_retry

FAILURES = FailureLog(logging.getLogger("notebook_controller"))

__all__ = ["KubeClient", "KubeError", "object_path"]

PLURALS = {
    "Notebook": "notebooks",
    "StatefulSet": "statefulsets",
    "Service": "services",
    "PersistentVolumeClaim": "persistentvolumeclaims",
    "Pod": "pods",
    "Event": "events",
    "VirtualService": "virtualservices",
    "AuthorizationPolicy": "authorizationpolicies",
    "Lease": "leases",
    "Namespace": "namespaces",
    "Profile": "profiles",
}
JSON_PATCH = "application/json-patch+json"


def object_path(
    api_version: str,
    kind: str,
    namespace: str | None,
    name: str | None = None,
    subresource: str | None = None,
) -> str:
    return resource_path(api_version, PLURALS[kind], namespace, name, subresource)


class KubeClient:
    """get / create / patch / delete by kind; failures are KubeErrors (`.status`, `.message`).

    Throttling (429, `Retry-After` obeyed), server errors and an unreachable API server are
    retried with the one backoff policy for up to RETRY_FOR seconds; then the handler fails
    and kopf (or the resync) comes back to it."""

    RETRY_FOR = 30.0

    def __init__(self, conn: AsyncConnection) -> None:
        self.conn = conn

    @classmethod
    async def connect(cls, kubeconfig: str = "", connections: int = 32) -> KubeClient:
        return cls(
            await AsyncConnection.connect(
                kubeconfig, connections, user_agent="mlcluster-notebook-controller"
            )
        )

    async def close(self) -> None:
        await self.conn.close()

    async def request(self, method: str, path: str, body: Any = None, **kwargs: Any) -> Any:
        return await call_async(
            lambda: self.conn.request(method, path, body, **kwargs),
            f"{method} {path}",
            give_up_after=self.RETRY_FOR,
            failures=FAILURES,
            on_retry=count_api_retry,
        )

    async def get(
        self, api_version: str, kind: str, namespace: str | None, name: str
    ) -> dict[str, Any] | None:
        try:
            return await self.request("GET", object_path(api_version, kind, namespace, name))
        except KubeError as exc:
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
        patch: Mapping[str, Any] | list[dict[str, Any]],
        subresource: str | None = None,
    ) -> dict[str, Any]:
        """A merge patch, or a JSON patch when given a list of operations."""
        json_patch = isinstance(patch, list)
        return await self.request(
            "PATCH",
            object_path(api_version, kind, namespace, name, subresource),
            list(patch) if isinstance(patch, list) else dict(patch),
            content_type=JSON_PATCH if json_patch else MERGE_PATCH,
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
        except KubeError as exc:
            if exc.status != 404:
                raise

    async def served_versions(self, group: str) -> list[str]:
        """Versions of an API group the server serves, preferred first ([] when absent)."""
        try:
            doc = await self.request("GET", f"/apis/{group}")
        except KubeError as exc:
            if exc.status == 404:
                return []
            raise
        preferred = doc.get("preferredVersion", {}).get("version")
        versions = [v["version"] for v in doc.get("versions", [])]
        return sorted(versions, key=lambda v: v != preferred)


async def connection_info(kubeconfig: str, settings: kopf.OperatorSettings) -> kopf.ConnectionInfo:
    """kopf's credentials from the same configuration the controller's own client loads
    (kopf's built-in client login only reads the default kubeconfig location)."""
    import kopf  # (only the operator logs in through kopf)

    loaded = (await load_config_async(kubeconfig)).configuration
    # The asyncio client refreshes tokens (exec/auth providers) when asked for the key.
    header = await loaded.get_api_key_with_prefix(
        "BearerToken"
    ) or await loaded.get_api_key_with_prefix("authorization")
    parts = header.split(" ", 1) if header else []
    scheme, token = (parts[0], parts[1]) if len(parts) == 2 else (None, parts[0] if parts else None)
    return kopf.ConnectionInfo(
        server=loaded.host,
        ca_path=loaded.ssl_ca_cert,
        insecure=not loaded.verify_ssl,
        username=loaded.username or None,
        password=loaded.password or None,
        scheme=scheme,
        token=token,
        certificate_path=loaded.cert_file,
        private_key_path=loaded.key_file,
        trust_env=settings.networking.trust_env,
    )
