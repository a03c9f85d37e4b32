"""A user's own namespace, ready for notebooks and jobs (pure builders).

One user, one namespace: in the mesh (`istio-injection: enabled`, so notebook
AuthorizationPolicies are enforced by a sidecar and nothing reaches a pod around them),
STRICT mTLS (a plain-text client inside the cluster is refused), Pod Security `baseline`
enforced (no privileged or host pods; `restricted` is warned and audited: the Jupyter images
and the Istio init container do not all fit it), its own service account with a Role for
`%%distributed --backend kubernetes` jobs in that namespace only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from jupyterlab_mlcluster.backends.kubernetes.rbac import notebook_rbac
from jupyterlab_mlcluster.notebook_resource import OWNER_ANNOTATION, profile_dispute, profile_owner

# Marks namespaces that hold users' notebooks and jobs: the admission policy's binding for job
# pod templates selects them.
USER_NAMESPACE_LABEL = "mlcluster.io/user-namespace"
# The label Kubeflow's profile controller puts on every Profile's namespace: those are user
# namespaces too (notebooks there run as `default-editor`), whoever made them.
PROFILE_NAMESPACE_LABELS = {"app.kubernetes.io/part-of": "kubeflow-profile"}
KUBEFLOW_NOTEBOOK_SERVICE_ACCOUNT = "default-editor"
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
        metadata["annotations"] = {OWNER_ANNOTATION: owner}
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": metadata}


def strict_mtls(namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "security.istio.io/v1",
        "kind": "PeerAuthentication",
        "metadata": {"name": "default", "namespace": namespace},
        "spec": {"mtls": {"mode": "STRICT"}},
    }


def user_namespace_objects(
    name: str, service_account: str, owner: str = ""
) -> list[dict[str, Any]]:
    """Namespace (marked with its `owner` when given), STRICT PeerAuthentication, service
    account + Role + RoleBinding (apply order)."""
    return [user_namespace(name, owner), strict_mtls(name), *notebook_rbac(name, service_account)]


def namespace_ownership(
    namespace: Mapping[str, Any] | None, profile: Mapping[str, Any] | None
) -> tuple[str | None, str]:
    """(who owns a namespace, why a Profile of its name does not decide it: "" when none
    or when it does).

    The `mlcluster.io/owner` annotation, where there is one, else the user of the Kubeflow
    Profile of that name when the Namespace agrees (notebook_resource.profile_dispute: Bob's
    Profile named after Alice's existing namespace makes Bob owner of nothing); None when
    nothing says (a namespace users share)."""
    annotations = ((namespace or {}).get("metadata") or {}).get("annotations") or {}
    marked = annotations.get(OWNER_ANNOTATION) or None
    if profile is None or profile_owner(profile) is None:
        return marked, ""
    dispute = profile_dispute(profile, namespace)
    if dispute is None:
        return profile_owner(profile), ""
    return marked, f"Profile not counted: {dispute}"


def namespace_owner(
    namespace: Mapping[str, Any] | None, profile: Mapping[str, Any] | None
) -> str | None:
    """Who owns a namespace (namespace_ownership)."""
    return namespace_ownership(namespace, profile)[0]


def foreign_owner_error(
    owner: str, namespace_name: str, owned_by: str | None, why: str = ""
) -> str | None:
    """Why a Notebook for `owner` may not run in a namespace `owned_by` someone (None: nobody
    said), or None when it may; `why`: what namespace_ownership said of the namespace's
    Profile, so the status says why a Profile its owner made did not count.

    A notebook admits its owner on the namespace's origin: one for Alice in Bob's namespace
    would put Alice on pages Bob controls, so the owner must own the namespace."""
    if owned_by is None or owned_by == owner:
        return None
    return (
        f"refused: namespace {namespace_name!r} belongs to another user, and a notebook may "
        f"only be owned by its namespace's owner (spec.owner {owner!r})"
        + (f"; {why}" if why else "")
    )
