"""Everything a platform team applies to run the notebook-controller (``mlcluster manifests``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from jupyterlab_mlcluster.backends.kubernetes.rbac import trainer_runtime_reader

from .admission import DEFAULT_ALLOWED_TOLERATIONS, admission_objects
from .crd import GROUP, PLURAL, notebook_crd
from .ingress import IngressAuth, ingress_objects
from .namespaces import KUBEFLOW_NOTEBOOK_SERVICE_ACCOUNT, user_namespace_objects
from .scheduling_policy import DEFAULT_SCHEDULING, SchedulingAllowList, system_priority_quota
from .server_deploy import server_objects
from .server_rbac import SERVICE_ACCOUNT as SERVER_SERVICE_ACCOUNT
from .server_rbac import server_rbac

try:
    from jupyterlab_mlcluster._version import __version__ as _VERSION
except ImportError:  # pragma: no cover - the controller can ship alone
    _VERSION = "0.0.0"

CONTROLLER_NAME = "notebook-controller"
DEFAULT_IMAGE = f"ghcr.io/jupyterlab-mlcluster/jupyterlab-mlcluster:{_VERSION}"
HEALTH_PORT = 8080
# What notebook pods run as in the user namespaces that `mlcluster manifests` prepares.
NOTEBOOK_SERVICE_ACCOUNT = "mlcluster-notebook"
# The Lease two controller replicas elect their leader with (in the controller's namespace).
LEASE_NAME = CONTROLLER_NAME
LEASE_RULES: list[dict[str, Any]] = [
    {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
    {
        "apiGroups": ["coordination.k8s.io"],
        "resources": ["leases"],
        "resourceNames": [LEASE_NAME],
        "verbs": ["get", "patch", "update"],
    },
]

# Least privilege: what the controller's requests need, nothing more (a test derives the
# requests a real run makes against the emulator and checks each is allowed by these rules,
# in the namespace it was made in).
#
# Cluster-wide (ClusterRoleBinding): reads only, for kopf's watches across namespaces.
_WATCHED = ["list", "watch"]
_MADE = ["get", "create", "patch"]


def _rule(group: str, resources: list[str], verbs: list[str]) -> dict[str, Any]:
    return {"apiGroups": [group], "resources": resources, "verbs": list(verbs)}


CLUSTER_RULES: list[dict[str, Any]] = [
    _rule(GROUP, [PLURAL], _WATCHED),
    _rule("apps", ["statefulsets"], _WATCHED),
    _rule("", ["services", "persistentvolumeclaims", "pods", "events"], _WATCHED),
    _rule("networking.istio.io", ["virtualservices"], _WATCHED),
    _rule("security.istio.io", ["authorizationpolicies"], _WATCHED),
    # kopf discovers served resources and follows CRDs being added or removed, and namespaces
    # when it serves a given list of them.
    _rule("apiextensions.k8s.io", ["customresourcedefinitions"], _WATCHED),
    _rule("", ["namespaces"], ["get", "list", "watch"]),
    # Whose namespace a Notebook is in (owners.NamespaceOwners).
    _rule("kubeflow.org", ["profiles"], ["get"]),
]
# In each user namespace (a ClusterRole bound there by a RoleBinding, like the shared
# server's): the notebooks' children, their status, the events re-issued on them. Nothing in
# any other namespace (istio-system, kube-system, the platform's).
USER_NAMESPACE_RULES: list[dict[str, Any]] = [
    _rule(GROUP, [PLURAL], ["get", "patch"]),
    _rule(GROUP, [f"{PLURAL}/status"], ["get", "patch"]),
    _rule("apps", ["statefulsets"], _MADE),
    _rule("", ["services", "persistentvolumeclaims"], _MADE),
    _rule("", ["events"], ["create", "patch"]),
    _rule("networking.istio.io", ["virtualservices"], _MADE),
    _rule("security.istio.io", ["authorizationpolicies"], _MADE),
]
# Everything the controller may do somewhere (the checks that hold for every rule).
RULES: list[dict[str, Any]] = [*CLUSTER_RULES, *USER_NAMESPACE_RULES]
USER_NAMESPACE_ROLE = f"mlcluster-{CONTROLLER_NAME}-user-namespace"


def _labels() -> dict[str, str]:
    return {
        "app.kubernetes.io/name": CONTROLLER_NAME,
        "app.kubernetes.io/part-of": "jupyterlab-mlcluster",
    }


def controller_deployment(namespace: str, image: str, args: list[str]) -> dict[str, Any]:
    security = {
        "runAsNonRoot": True,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": CONTROLLER_NAME, "namespace": namespace, "labels": _labels()},
        "spec": {
            # Two replicas, one leader (a Lease): a lost node does not stop reconciling and
            # culling, and a rolling upgrade hands over without a gap.
            "replicas": 2,
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1},
            },
            "selector": {"matchLabels": {"app.kubernetes.io/name": CONTROLLER_NAME}},
            "template": {
                "metadata": {"labels": _labels()},
                "spec": {
                    "serviceAccountName": CONTROLLER_NAME,
                    "securityContext": {
                        "runAsNonRoot": True,
                        "seccompProfile": {"type": "RuntimeDefault"},
                    },
                    "containers": [
                        {
                            "name": "controller",
                            "image": image,
                            "command": ["mlcluster", "controller"],
                            "args": [f"--liveness=http://0.0.0.0:{HEALTH_PORT}/healthz", *args],
                            # The leader's identity: the pod (a restarted container takes its
                            # own lease back at once).
                            "env": [
                                {
                                    "name": "POD_NAME",
                                    "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}},
                                }
                            ],
                            "ports": [{"name": "http-health", "containerPort": HEALTH_PORT}],
                            "livenessProbe": {
                                "httpGet": {"path": "/healthz", "port": HEALTH_PORT},
                                "periodSeconds": 30,
                                "timeoutSeconds": 5,
                            },
                            "resources": {
                                "requests": {"cpu": "100m", "memory": "256Mi"},
                                "limits": {"memory": "1Gi"},
                            },
                            "securityContext": security,
                        }
                    ],
                },
            },
        },
    }


def controller_user_namespace_binding(
    namespace: str, subjects: list[dict[str, str]]
) -> dict[str, Any]:
    """The controller's writes in one user namespace. For user namespaces not given to
    `mlcluster manifests` (Kubeflow Profiles), the platform makes the same RoleBinding there."""
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": USER_NAMESPACE_ROLE, "namespace": namespace, "labels": _labels()},
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": USER_NAMESPACE_ROLE,
        },
        "subjects": [dict(subject) for subject in subjects],
    }


def all_manifests(
    *,
    namespace: str = "mlcluster-system",
    image: str = DEFAULT_IMAGE,
    gateway: str = "istio-system/mlcluster-gateway",
    host: str = "*",
    owner_header: str = "kubeflow-userid",
    include_gateway: bool = True,
    ingress_auth: IngressAuth | None = None,
    tls_secret: str = "",
    extra_args: list[str] | None = None,
    user_namespaces: Sequence[str] = (),
    notebook_service_account: str = NOTEBOOK_SERVICE_ACCOUNT,
    server_namespace: str = "",
    server_service_account: str = SERVER_SERVICE_ACCOUNT,
    namespace_owners: Mapping[str, str] | None = None,
    insecure_header_trust: bool = False,
    allowed_tolerations: Sequence[str] = tuple(DEFAULT_ALLOWED_TOLERATIONS),
    allowed_storage_classes: Sequence[str] = (),
    scheduling: SchedulingAllowList = DEFAULT_SCHEDULING,
    route_namespaces: Sequence[str] = (),
) -> list[dict[str, Any]]:
    """CRD, namespace, service account, RBAC, the controller Deployment (2 replicas, one
    leader), the admission policy for pod templates (`scheduling`: what they may ask of the
    scheduler); the Gateway with JWT verification when
    an issuer is given (`ingress_auth`: never an unauthenticated Gateway), binding the routes
    of the server's namespace, the user namespaces and `route_namespaces` only; with
    `user_namespaces`, each user's namespace (meshed, Pod Security baseline, STRICT mTLS;
    marked with its owner from `namespace_owners`, whom alone the controller lets own
    notebooks there; a ResourceQuota that admits no pod of the system PriorityClasses) and
    the service account its notebook pods run as there, allowed to run `%%distributed
    --backend kubernetes` jobs in that namespace and nothing more; last, the shared Jupyter
    server's own least-privilege RBAC (its service account in `server_namespace`, default the
    controller's; server_rbac.py), allowed into each of `user_namespaces`, and the server
    itself (server_deploy.py: Deployment, Service, its route on the gateway, and policies that
    admit only the gateway's identity). The server itself only with `ingress_auth` (it then
    verifies the gateway's JWT too), or with `insecure_header_trust`, the explicit choice of
    a server that believes the identity header with no JWT check at all."""
    role = f"mlcluster-{CONTROLLER_NAME}"
    args = [
        f"--gateway={gateway}",
        f"--host={host}",
        f"--owner-header={owner_header}",
        f"--ControllerConfig.controller_principal=cluster.local/ns/{namespace}/sa/{CONTROLLER_NAME}",
        f"--ControllerConfig.leader_election_namespace={namespace}",
    ]
    if user_namespaces:
        args.append(f"--ControllerConfig.service_account={notebook_service_account}")
    args += extra_args or []
    binding_subjects = [{"kind": "ServiceAccount", "name": CONTROLLER_NAME, "namespace": namespace}]
    manifests = [
        notebook_crd(),
        # In the mesh: the notebooks' AuthorizationPolicy admits the controller by its identity.
        {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {
                "name": namespace,
                "labels": {"istio-injection": "enabled"},
            },
        },
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": CONTROLLER_NAME, "namespace": namespace, "labels": _labels()},
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": role, "labels": _labels()},
            "rules": CLUSTER_RULES,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": role, "labels": _labels()},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": role,
            },
            "subjects": binding_subjects,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": USER_NAMESPACE_ROLE, "labels": _labels()},
            "rules": USER_NAMESPACE_RULES,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": f"{role}-leader", "namespace": namespace, "labels": _labels()},
            "rules": LEASE_RULES,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": f"{role}-leader", "namespace": namespace, "labels": _labels()},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": f"{role}-leader",
            },
            "subjects": binding_subjects,
        },
        controller_deployment(namespace, image, args),
        # Kubeflow Profile namespaces' notebooks (and so their jobs and schedules) run as
        # default-editor: the policy binds there too.
        *admission_objects(
            [notebook_service_account, "default", KUBEFLOW_NOTEBOOK_SERVICE_ACCOUNT],
            allowed_tolerations,
            allowed_storage_classes,
            scheduling,
            owner_header,
            gateway,
            host,
        ),
    ]
    if include_gateway and ingress_auth is not None:
        # Routes bind only from where the platform makes them: the server's, each user
        # namespace's notebooks (the controller's), and namespaces the platform names.
        routes = [server_namespace or namespace, *user_namespaces, *route_namespaces]
        manifests += ingress_objects(gateway, host, ingress_auth, tls_secret, routes)
    for user_namespace in user_namespaces:
        owner = (namespace_owners or {}).get(user_namespace, "")
        manifests += user_namespace_objects(user_namespace, notebook_service_account, owner)
        manifests.append(system_priority_quota(user_namespace))
        manifests.append(controller_user_namespace_binding(user_namespace, binding_subjects))
    if user_namespaces:  # TrainJobs name ClusterTrainingRuntimes: reading them is cluster-wide
        manifests += trainer_runtime_reader(
            [(n, notebook_service_account) for n in user_namespaces]
        )
    manifests += server_rbac(
        server_namespace or namespace, tuple(user_namespaces), server_service_account
    )
    if ingress_auth is None and not insecure_header_trust:
        return manifests
    manifests += server_objects(
        namespace=server_namespace or namespace,
        image=image,
        service_account=server_service_account,
        gateway=gateway,
        host=host,
        owner_header=owner_header,
        auth=ingress_auth,
        watched_namespaces=tuple(user_namespaces),
    )
    return manifests
