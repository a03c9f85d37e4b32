"""A user's own namespace, ready for notebooks and jobs (pure builders).

One user, one namespace: in the mesh (`istio-injection: enabled`, so notebook
AuthorizationPolicies are enforced by a sidecar and nothing reaches a pod around them),
STRICT mTLS (a plain-text client inside the cluster is refused), Pod Security `baseline`
enforced (no privileged or host pods; `restricted` is warned and audited: the Jupyter images
and the Istio init container do not all fit it), its own service account with a Role for
`%%distributed --backend kubernetes` jobs in that namespace only.
"""

from __future__ import annotations

from typing import Any

from jupyterlab_mlcluster.backends.kubernetes.rbac import notebook_rbac

# Marks namespaces that hold users' notebooks and jobs: the admission policy's binding for job
# pod templates selects them.
USER_NAMESPACE_LABEL = "mlcluster.io/user-namespace"
POD_SECURITY_LEVEL = "baseline"


def user_namespace(name: str, owner: str = "") -> dict[str, Any]:
    labels = {
        "istio-injection": "enabled",
        USER_NAMESPACE_LABEL: "true",
        "pod-security.kubernetes.io/enforce": POD_SECURITY_LEVEL,
        "pod-security.kubernetes.io/enforce-version": "latest",
        "pod-security.kubernetes.io/warn": "restricted",
        "pod-security.kubernetes.io/audit": "restricted",
    }
    metadata: dict[str, Any] = {"name": name, "labels": labels}
    if owner:
        metadata["annotations"] = {"mlcluster.io/owner": owner}
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": metadata}


def strict_mtls(namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "security.istio.io/v1",
        "kind": "PeerAuthentication",
        "metadata": {"name": "default", "namespace": namespace},
        "spec": {"mtls": {"mode": "STRICT"}},
    }


def user_namespace_objects(name: str, service_account: str) -> list[dict[str, Any]]:
    """Namespace, STRICT PeerAuthentication, service account + Role + RoleBinding (apply order)."""
    return [user_namespace(name), strict_mtls(name), *notebook_rbac(name, service_account)]
