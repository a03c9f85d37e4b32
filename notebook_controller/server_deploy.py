"""The shared Jupyter server itself, deployed the safe way (pure builders; `mlcluster manifests`).

The shared server takes each caller's identity from the header the ingress gateway writes
from a verified JWT (`MLClusterApp.trust_identity_header`). That is only true of requests that
came through the gateway, so the layout printed here is the one where nothing else can reach
it:

- a Deployment running `jupyter lab` under `ingress.SERVER_PREFIX` as the server's own
  service account (server_rbac.py's least privilege), in the mesh, non-root, with a volume for
  its job store;
- a Service and a VirtualService on the gateway for that prefix (the gateway's DENY policy in
  ingress.py requires a verified JWT there);
- an AuthorizationPolicy (ALLOW) on the server's pods that admits only the ingress gateway's
  mTLS identity: a notebook or job pod inside the mesh that sends `kubeflow-userid: alice`
  itself is refused (it has its own identity, and a plain-text caller has none), and a STRICT
  PeerAuthentication on them, so no plain-text request reaches the pod around its sidecar.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .ingress import GATEWAY_PRINCIPAL, PAYLOAD_HEADER, SERVER_PREFIX, IngressAuth

SERVER_NAME = "mlcluster-jupyter-server"
SERVER_PORT = 8888
SERVICE_PORT = 80
STORE_CLAIM = f"{SERVER_NAME}-store"
# The image's home (deploy/images/jupyterlab-mlcluster.Containerfile), where the store lives.
HOME = "/home/mlcluster"


def _labels() -> dict[str, str]:
    return {
        "app.kubernetes.io/name": SERVER_NAME,
        "app.kubernetes.io/part-of": "jupyterlab-mlcluster",
    }


def _selector() -> dict[str, str]:
    return {"app.kubernetes.io/name": SERVER_NAME}


def _meta(name: str, namespace: str) -> dict[str, Any]:
    return {"name": name, "namespace": namespace, "labels": _labels()}


SERVER_MAX_BODY = 16 << 20


def server_command(
    owner_header: str, auth: IngressAuth | None = None, watched_namespaces: Sequence[str] = ()
) -> list[str]:
    """`jupyter lab` under the server prefix, taking identities from the gateway's header, and
    with `auth` (the gateway's issuer) checking the claims of the JWT the gateway verified
    itself (the payload it passes on; the raw token goes to no route), so that the identity
    header alone never names a caller.

    Jupyter's own token is off: the gateway's JWT is the login, this pod admits nothing but the
    gateway, and with the trusted header the server's Authorizer keeps callers to the mlcluster
    API and the lab page. `watched_namespaces`: the user namespaces whose Notebooks it
    follows, each on its own (its RBAC grants those reads there only, server_rbac.py)."""
    verify = []
    if auth is not None:
        verify = [
            f"--MLClusterApp.jwt_issuer={auth.issuer}",
            f"--MLClusterApp.jwt_user_claim={auth.user_claim}",
            *([f"--MLClusterApp.jwt_jwks_uri={auth.jwks_uri}"] if auth.jwks_uri else []),
            *(f"--MLClusterApp.jwt_audiences={audience}" for audience in auth.audiences),
            # The gateway drops the raw token and passes on its verified payload here.
            f"--MLClusterApp.jwt_payload_header={PAYLOAD_HEADER}",
        ]
    return [
        "jupyter",
        "lab",
        "--no-browser",
        "--ServerApp.ip=0.0.0.0",
        f"--ServerApp.port={SERVER_PORT}",
        f"--ServerApp.base_url={SERVER_PREFIX}/",
        "--IdentityProvider.token=",
        # Tornado buffers a request whole before any handler sees it: a few MiB, not Jupyter's
        # 512 MiB default, so that one caller cannot spend the pod's memory on bodies (the
        # mlcluster API reads at most MLClusterApp.max_request_body of it).
        f"--ServerApp.max_body_size={SERVER_MAX_BODY}",
        f"--ServerApp.max_buffer_size={SERVER_MAX_BODY}",
        "--MLClusterApp.trust_identity_header=True",
        f"--MLClusterApp.identity_header={owner_header}",
        *verify,
        *(f"--MLClusterApp.watched_namespaces={namespace}" for namespace in watched_namespaces),
    ]


def server_store_claim(namespace: str, size: str = "10Gi") -> dict[str, Any]:
    """The job store (records, logs, results) outlives a restart of the server's pod."""
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": _meta(STORE_CLAIM, namespace),
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": size}}},
    }


def server_deployment(
    namespace: str,
    image: str,
    service_account: str,
    owner_header: str,
    auth: IngressAuth | None = None,
    watched_namespaces: Sequence[str] = (),
) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta(SERVER_NAME, namespace),
        "spec": {
            "replicas": 1,  # one store on a ReadWriteOnce volume: never two writers
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": _selector()},
            "template": {
                # Injected even where its namespace is not labelled for the mesh: without the
                # sidecar, the policies below would not be enforced at all.
                "metadata": {"labels": {**_labels(), "sidecar.istio.io/inject": "true"}},
                "spec": {
                    "serviceAccountName": service_account,
                    "securityContext": {
                        "runAsNonRoot": True,
                        "runAsUser": 1000,  # the image's user
                        "fsGroup": 1000,  # the store volume writable by it
                        "seccompProfile": {"type": "RuntimeDefault"},
                    },
                    "containers": [
                        {
                            "name": "jupyter",
                            "image": image,
                            "command": server_command(owner_header, auth, watched_namespaces),
                            "ports": [{"name": "http-jupyter", "containerPort": SERVER_PORT}],
                            # A TCP probe: a shared server answers little of Jupyter's own
                            # API (server/confinement.py), and nothing without an identity.
                            "readinessProbe": {
                                "tcpSocket": {"port": SERVER_PORT},
                                "periodSeconds": 10,
                            },
                            "resources": {
                                "requests": {"cpu": "500m", "memory": "1Gi"},
                                "limits": {"memory": "4Gi"},
                            },
                            "securityContext": {
                                "allowPrivilegeEscalation": False,
                                "capabilities": {"drop": ["ALL"]},
                            },
                            "volumeMounts": [{"name": "store", "mountPath": HOME}],
                        }
                    ],
                    "volumes": [
                        {"name": "store", "persistentVolumeClaim": {"claimName": STORE_CLAIM}}
                    ],
                },
            },
        },
    }


def server_service(namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(SERVER_NAME, namespace),
        "spec": {
            "selector": _selector(),
            "ports": [
                {
                    "name": "http-jupyter",
                    "port": SERVICE_PORT,
                    "targetPort": SERVER_PORT,
                    "protocol": "TCP",
                }
            ],
        },
    }


def server_virtual_service(namespace: str, gateway: str, host: str) -> dict[str, Any]:
    """The gateway's route to the server: its prefix, unchanged (base_url is the prefix)."""
    return {
        "apiVersion": "networking.istio.io/v1",
        "kind": "VirtualService",
        "metadata": _meta(SERVER_NAME, namespace),
        "spec": {
            "hosts": [host],
            "gateways": [gateway],
            "http": [
                {
                    "name": "jupyter-server",
                    "match": [
                        {"uri": {"prefix": f"{SERVER_PREFIX}/"}},
                        {"uri": {"exact": SERVER_PREFIX}},
                    ],
                    "route": [
                        {
                            "destination": {
                                "host": f"{SERVER_NAME}.{namespace}.svc.cluster.local",
                                "port": {"number": SERVICE_PORT},
                            }
                        }
                    ],
                }
            ],
        },
    }


def server_authorization_policy(
    namespace: str, gateway_principal: str = GATEWAY_PRINCIPAL
) -> dict[str, Any]:
    """ALLOW only the ingress gateway's identity: with an ALLOW policy on a workload, Istio
    refuses every request no rule matches, so any other pod of the mesh (whatever headers it
    writes) and any plain-text caller (no identity at all) is denied."""
    return {
        "apiVersion": "security.istio.io/v1",
        "kind": "AuthorizationPolicy",
        "metadata": _meta(SERVER_NAME, namespace),
        "spec": {
            "selector": {"matchLabels": _selector()},
            "action": "ALLOW",
            "rules": [{"from": [{"source": {"principals": [gateway_principal]}}]}],
        },
    }


def server_peer_authentication(namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "security.istio.io/v1",
        "kind": "PeerAuthentication",
        "metadata": _meta(SERVER_NAME, namespace),
        "spec": {"selector": {"matchLabels": _selector()}, "mtls": {"mode": "STRICT"}},
    }


def server_objects(
    *,
    namespace: str,
    image: str,
    service_account: str,
    gateway: str,
    host: str,
    owner_header: str,
    gateway_principal: str = GATEWAY_PRINCIPAL,
    auth: IngressAuth | None = None,
    watched_namespaces: Sequence[str] = (),
) -> list[dict[str, Any]]:
    """Store volume, Deployment, Service, route, and the two policies (apply order; the
    service account and RBAC are server_rbac.py's); with `auth`, the server verifies the
    gateway's forwarded JWT itself."""
    return [
        server_store_claim(namespace),
        server_peer_authentication(namespace),
        server_authorization_policy(namespace, gateway_principal),
        server_deployment(
            namespace, image, service_account, owner_header, auth, watched_namespaces
        ),
        server_service(namespace),
        server_virtual_service(namespace, gateway, host),
    ]
