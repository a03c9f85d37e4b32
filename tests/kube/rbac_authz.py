"""Kubernetes RBAC's decision for one request, over printed manifests, for attacker tests.

As the API server's RBAC authorizer decides (https://kubernetes.io/docs/reference/
access-authn-authz/rbac/): a ClusterRoleBinding grants its ClusterRole's rules in every
namespace and on cluster-scoped resources; a RoleBinding grants its Role's (or a
ClusterRole's) rules in its own namespace only. A rule matches when its apiGroups,
resources (with `*` or `resource/subresource`), verbs (or `*`) and, if set, resourceNames
match. Aggregated ClusterRoles and non-resource URLs are not used by the shipped manifests
and raise.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def _matches(rule: Mapping[str, Any], verb: str, group: str, resource: str, name: str) -> bool:
    if "nonResourceURLs" in rule:
        raise NotImplementedError("nonResourceURLs are not evaluated here")
    return (
        any(g in ("*", group) for g in rule.get("apiGroups") or [])
        and any(r in ("*", resource) for r in rule.get("resources") or [])
        and any(v in ("*", verb) for v in rule.get("verbs") or [])
        and (not rule.get("resourceNames") or name in rule["resourceNames"])
    )


def _roles(manifests: Sequence[Mapping[str, Any]]) -> dict[tuple[str, str, str], list[Any]]:
    roles = {}
    for obj in manifests:
        if obj["kind"] in ("Role", "ClusterRole"):
            if obj.get("aggregationRule"):
                raise NotImplementedError("aggregated ClusterRoles are not evaluated here")
            namespace = obj["metadata"].get("namespace", "") if obj["kind"] == "Role" else ""
            roles[(obj["kind"], namespace, obj["metadata"]["name"])] = obj.get("rules") or []
    return roles


def can(
    manifests: Sequence[Mapping[str, Any]],
    service_account: tuple[str, str],
    verb: str,
    group: str,
    resource: str,
    namespace: str | None,
    name: str = "",
) -> bool:
    """Whether the service account (namespace, name) may `verb` `group`/`resource` in
    `namespace` (None: cluster-scoped, or across all namespaces)."""
    roles = _roles(manifests)
    namespace_of_account, name_of_account = service_account
    subject = {"kind": "ServiceAccount", "namespace": namespace_of_account, "name": name_of_account}
    for binding in manifests:
        if binding["kind"] not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        if not any(
            {k: s.get(k) for k in ("kind", "namespace", "name")} == subject
            for s in binding.get("subjects") or []
        ):
            continue
        where = binding["metadata"].get("namespace") if binding["kind"] == "RoleBinding" else None
        if where is not None and where != namespace:
            continue  # a RoleBinding grants nothing outside its namespace
        ref = binding["roleRef"]
        role_namespace = where if ref["kind"] == "Role" else ""
        rules = roles.get((ref["kind"], role_namespace or "", ref["name"]), [])
        if any(_matches(rule, verb, group, resource, name) for rule in rules):
            return True
    return False
