"""RBAC for the shared Jupyter server (the extension with per-user namespaces): what its calls
need, nothing more (pure builders; `mlcluster manifests` prints them, with the server's
Deployment from server_deploy.py: both are the shared server as a platform deploys it, and
the server itself never reads them, so they live on this side and the server does not import
the controller, nor the controller the server).

One rule per call site, each naming it; tests/kube/notebooks_api/test_server_rbac.py
records every request a real server (and its jobs' supervisors) makes against the Kubernetes
API emulator and checks each one is granted here, in the namespace it was made in.

- Cluster-wide reads (`CLUSTER_RULES`, a ClusterRole bound cluster-wide):
  - Profiles: list, and Namespaces: get (`notebooks.UserNamespaces`: which namespace a user
    owns; a Profile counts only where the Namespace of its name agrees);
  - Notebooks and Events: list, watch in all namespaces (`notebook_watch.py`: one watch for
    every user's notebooks and their events on `/events`), only where the user namespaces are
    not known in advance (Kubeflow Profiles): with user namespaces given, these reads are in
    the user-namespace role instead and the server watches each of them
    (`MLClusterApp.watched_namespaces`);
  - ClusterTrainingRuntimes: get, list (`KubernetesBackend._check_runtime`, at submit);
  - Nodes: list (`KubernetesBackend._nodes`: capacity, and GPUs a pod can never get).
  Not granted: listing pods cluster-wide (`KubernetesBackend._requested`, the free share in
  GET /cluster, which then says "unknown"): it would show every pod's spec and environment.
- In each user namespace (`USER_NAMESPACE_RULES`, a ClusterRole bound there by a RoleBinding):
  - Notebooks: get, create, patch, delete (`notebooks.NotebookService`);
  - what running jobs takes (`backends.kubernetes.rbac.job_rules`): a REST-submitted job's
    objects go to the caller's namespace, and its supervisor runs with the server's
    credentials. Secrets: create and delete only.
- In the server's own namespace (`OWN_NAMESPACE_RULES`): pods get (`client.own_pod`, the
  default image of jobs).
No `*`, no escalate/bind/impersonate, nothing in namespaces that are not users'.
"""

from __future__ import annotations

from typing import Any

from jupyterlab_mlcluster.backends.kubernetes.rbac import job_rules

SERVICE_ACCOUNT = "mlcluster-jupyter-server"
ROLE = "mlcluster-jupyter-server"
USER_NAMESPACE_ROLE = "mlcluster-jupyter-server-user-namespace"
NOTEBOOK_GROUP = "mlcluster.io"


def _rule(group: str, resources: list[str], verbs: list[str]) -> dict[str, Any]:
    return {"apiGroups": [group], "resources": resources, "verbs": verbs}


# The watch behind /events (notebook_watch.py): cluster-wide, or in each user namespace when
# the server is told which (MLClusterApp.watched_namespaces; `mlcluster manifests` does).
WATCH_RULES: list[dict[str, Any]] = [
    _rule(NOTEBOOK_GROUP, ["notebooks"], ["list", "watch"]),
    _rule("", ["events"], ["list", "watch"]),
]
CLUSTER_RULES: list[dict[str, Any]] = [
    _rule("kubeflow.org", ["profiles"], ["list"]),
    _rule("", ["namespaces"], ["get"]),
    *WATCH_RULES,
    _rule("trainer.kubeflow.org", ["clustertrainingruntimes"], ["get", "list"]),
    _rule("", ["nodes"], ["list"]),
]

USER_NAMESPACE_RULES: list[dict[str, Any]] = [
    _rule(NOTEBOOK_GROUP, ["notebooks"], ["get", "create", "patch", "delete"]),
    *job_rules(),
]


def cluster_rules(watched_per_namespace: bool) -> list[dict[str, Any]]:
    """The cluster-wide reads; without the notebook watch's when it runs per namespace."""
    if not watched_per_namespace:
        return CLUSTER_RULES
    return [rule for rule in CLUSTER_RULES if rule not in WATCH_RULES]


def user_namespace_rules(watched_per_namespace: bool) -> list[dict[str, Any]]:
    return [*USER_NAMESPACE_RULES, *(WATCH_RULES if watched_per_namespace else [])]


OWN_NAMESPACE_RULES: list[dict[str, Any]] = [_rule("", ["pods"], ["get"])]

# Calls the server makes knowing they may be refused, and copes (deliberately not granted).
MAY_BE_REFUSED: list[dict[str, str]] = [
    # KubernetesBackend._requested: GET /cluster's free share ("unknown" without it).
    {"verb": "list", "group": "", "resource": "pods"},
]

LABELS = {
    "app.kubernetes.io/name": SERVICE_ACCOUNT,
    "app.kubernetes.io/part-of": "jupyterlab-mlcluster",
}


def _meta(name: str, namespace: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": dict(LABELS)}
    if namespace:
        meta["namespace"] = namespace
    return meta


def _binding(
    kind: str, name: str, role_kind: str, role: str, subject: dict[str, str], namespace: str = ""
) -> dict[str, Any]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": kind,
        "metadata": _meta(name, namespace or None),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind, "name": role},
        "subjects": [subject],
    }


def server_rbac(
    namespace: str,
    user_namespaces: list[str] | tuple[str, ...] = (),
    service_account: str = SERVICE_ACCOUNT,
) -> list[dict[str, Any]]:
    """The server's ServiceAccount (in `namespace`, where the server runs), its cluster-wide
    reads, its own-pod read, and the user-namespace ClusterRole bound in each of
    `user_namespaces` (apply after those namespaces exist)."""
    subject = {"kind": "ServiceAccount", "name": service_account, "namespace": namespace}
    rbac = "rbac.authorization.k8s.io/v1"
    objects: list[dict[str, Any]] = [
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": _meta(service_account, namespace),
        },
        {
            "apiVersion": rbac,
            "kind": "ClusterRole",
            "metadata": _meta(ROLE),
            # With user namespaces given, the server watches each (watched_namespaces).
            "rules": cluster_rules(bool(user_namespaces)),
        },
        _binding("ClusterRoleBinding", ROLE, "ClusterRole", ROLE, subject),
        {
            "apiVersion": rbac,
            "kind": "ClusterRole",
            "metadata": _meta(USER_NAMESPACE_ROLE),
            "rules": user_namespace_rules(bool(user_namespaces)),
        },
        {
            "apiVersion": rbac,
            "kind": "Role",
            "metadata": _meta(ROLE, namespace),
            "rules": OWN_NAMESPACE_RULES,
        },
        _binding("RoleBinding", ROLE, "Role", ROLE, subject, namespace),
    ]
    objects += [
        _binding(
            "RoleBinding",
            USER_NAMESPACE_ROLE,
            "ClusterRole",
            USER_NAMESPACE_ROLE,
            subject,
            user_namespace,
        )
        for user_namespace in user_namespaces
    ]
    return objects
