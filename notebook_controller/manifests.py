"""Everything a platform team applies to run the notebook-controller (``mlcluster manifests``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .crd import GROUP, PLURAL, notebook_crd

from jupyterlab_mlcluster.backends.kubernetes.rbac import notebook_rbac, trainer_runtime_reader

try:
    from jupyterlab_mlcluster._version import __version__ as _VERSION
except ImportError:  # pragma: no cover - the controller can ship alone
    _VERSION = "0.0.0"

CONTROLLER_NAME = "notebook-controller"
DEFAULT_IMAGE = f"ghcr.io/jupyterlab-mlcluster/jupyterlab-mlcluster:{_VERSION}"
HEALTH_PORT = 8080
# What notebook pods run as in the user namespaces that `mlcluster manifests` prepares.
NOTEBOOK_SERVICE_ACCOUNT = "mlcluster-notebook"

# Least privilege: what the controller's requests need, nothing more (a test derives the
# requests a real run makes against the emulator and checks each is allowed by these rules).
RULES: list[dict[str, Any]] = [
    {"apiGroups": [GROUP], "resources": [PLURAL], "verbs": ["get", "list", "watch", "patch"]},
    {"apiGroups": [GROUP], "resources": [f"{PLURAL}/status"], "verbs": ["get", "patch"]},
    {
        "apiGroups": ["apps"],
        "resources": ["statefulsets"],
        "verbs": ["get", "list", "watch", "create", "patch"],
    },
    {
        "apiGroups": [""],
        "resources": ["services", "persistentvolumeclaims"],
        "verbs": ["get", "list", "watch", "create", "patch"],
    },
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]},
    {"apiGroups": [""], "resources": ["events"], "verbs": ["list", "watch", "create", "patch"]},
    {
        "apiGroups": ["networking.istio.io"],
        "resources": ["virtualservices"],
        "verbs": ["get", "list", "watch", "create", "patch"],
    },
    {
        "apiGroups": ["security.istio.io"],
        "resources": ["authorizationpolicies"],
        "verbs": ["get", "list", "watch", "create", "patch"],
    },
    # kopf discovers served resources and follows CRDs being added or removed, and namespaces
    # when it serves a given list of them.
    {
        "apiGroups": ["apiextensions.k8s.io"],
        "resources": ["customresourcedefinitions"],
        "verbs": ["list", "watch"],
    },
    {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["list", "watch"]},
]


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
            "replicas": 1,
            # Standalone kopf: two controllers must never overlap during an upgrade.
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": {"app.kubernetes.io/name": CONTROLLER_NAME}},
            "template": {
                "metadata": {"labels": _labels()},
                "spec": {
                    "serviceAccountName": CONTROLLER_NAME,
                    "containers": [
                        {
                            "name": "controller",
                            "image": image,
                            "command": ["mlcluster", "controller"],
                            "args": [f"--liveness=http://0.0.0.0:{HEALTH_PORT}/healthz", *args],
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


def example_gateway(gateway: str, host: str) -> dict[str, Any]:
    namespace, _, name = gateway.rpartition("/")
    return {
        "apiVersion": "networking.istio.io/v1",
        "kind": "Gateway",
        "metadata": {
            "name": name,
            "namespace": namespace or "istio-system",
            "annotations": {
                "mlcluster.io/note": "Example: use your own Gateway, with "
                "TLS and the auth proxy that sets the identity header."
            },
        },
        "spec": {
            "selector": {"istio": "ingressgateway"},
            "servers": [
                {"port": {"number": 80, "name": "http", "protocol": "HTTP"}, "hosts": [host]}
            ],
        },
    }


def all_manifests(
    *,
    namespace: str = "mlcluster-system",
    image: str = DEFAULT_IMAGE,
    gateway: str = "istio-system/mlcluster-gateway",
    host: str = "*",
    owner_header: str = "kubeflow-userid",
    include_gateway: bool = True,
    extra_args: list[str] | None = None,
    user_namespaces: Sequence[str] = (),
    notebook_service_account: str = NOTEBOOK_SERVICE_ACCOUNT,
) -> list[dict[str, Any]]:
    """CRD, namespace, service account, RBAC, controller Deployment and an example Gateway;
    with `user_namespaces`, also the service account its notebook pods run as there, allowed
    to run `%%distributed --backend kubernetes` jobs in that namespace and nothing more."""
    role = f"mlcluster-{CONTROLLER_NAME}"
    args = [
        f"--gateway={gateway}",
        f"--host={host}",
        f"--owner-header={owner_header}",
        f"--ControllerConfig.controller_principal=cluster.local/ns/{namespace}/sa/{CONTROLLER_NAME}",
    ]
    if user_namespaces:
        args.append(f"--ControllerConfig.service_account={notebook_service_account}")
    args += extra_args or []
    manifests = [
        notebook_crd(),
        # In the mesh: the notebooks' AuthorizationPolicy admits the controller by its identity.
        {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": namespace, "labels": {"istio-injection": "enabled"}},
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
            "rules": RULES,
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
            "subjects": [
                {"kind": "ServiceAccount", "name": CONTROLLER_NAME, "namespace": namespace}
            ],
        },
        controller_deployment(namespace, image, args),
    ]
    if include_gateway:
        manifests.append(example_gateway(gateway, host))
    for user_namespace in user_namespaces:
        manifests += notebook_rbac(user_namespace, notebook_service_account)
    if user_namespaces:  # TrainJobs name ClusterTrainingRuntimes: reading them is cluster-wide
        manifests += trainer_runtime_reader(
            [(n, notebook_service_account) for n in user_namespaces]
        )
    return manifests
