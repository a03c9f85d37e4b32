"""User B (mallory) against user A (alice), on the cluster side: each attack refused.

Against the Kubernetes API emulator with the real controller (kopf), the shipped manifests
checked against Istio's upstream CRDs and Kubernetes 1.33 schemas, and the shipped
ValidatingAdmissionPolicy's own CEL expressions evaluated with a CEL interpreter.
"""

from __future__ import annotations

import copy
import datetime
import time
from typing import Any

import jsonschema
import pytest
import yaml

from notebook_controller import objects
from notebook_controller.admission import admission_objects, admission_policy
from notebook_controller.cli import print_manifests
from notebook_controller.ingress import IngressAuth
from notebook_controller.manifests import NOTEBOOK_SERVICE_ACCOUNT, all_manifests
from notebook_controller.namespaces import USER_NAMESPACE_LABEL
from tests.kube.admission_cel import denials
from tests.kube.controller_support import NB, create_notebook, owned, wait_owned, wait_phase
from tests.kube.helpers import Kube, KubeApiError
from tests.kube.istio import SPEC_SCHEMAS, strict_json_schema
from tests.kube.istio_authz import Request, allowed
from tests.kube.istio_upstream import validate_istio_upstream
from tests.kube.validation import validate_builtin_uncached

AUTH = IngressAuth(
    issuer="https://dex.example.com",
    jwks_uri="https://dex.example.com/keys",
    audiences=("mlcluster",),
    user_claim="email",
    owner_header="kubeflow-userid",
)


def _validate(obj: dict[str, Any]) -> None:
    if obj["kind"] == "VirtualService":  # not in the upstream CRD excerpt: Istio's API reference
        jsonschema.validate(obj["spec"], strict_json_schema(SPEC_SCHEMAS["VirtualService"]))
    elif "istio.io" in obj["apiVersion"]:
        validate_istio_upstream(obj)
    else:
        assert validate_builtin_uncached(obj) == [], obj["kind"]


# --- 1. a forged identity header at the ingress -------------------------------------------------


@pytest.mark.slow
def test_attack_forged_identity_header_needs_a_verified_jwt() -> None:
    """Mallory sends `kubeflow-userid: alice` with no token (or a token without the claim):
    the shipped Gateway comes with a RequestAuthentication that writes the header from the
    verified claim (replacing the client's), and a DENY policy for requests without a verified
    request principal or without the claim, on the notebook paths."""
    manifests = all_manifests(ingress_auth=AUTH, host="ml.example.com", tls_secret="ml-tls")
    for manifest in manifests:
        _validate(manifest)
    kinds = [m["kind"] for m in manifests]
    assert "Gateway" in kinds
    gateway = next(m for m in manifests if m["kind"] == "Gateway")
    selector = gateway["spec"]["selector"]
    [authn] = [m for m in manifests if m["kind"] == "RequestAuthentication"]
    assert authn["spec"]["selector"]["matchLabels"] == selector
    [rule] = authn["spec"]["jwtRules"]
    assert rule["issuer"] == AUTH.issuer and rule["jwksUri"] == AUTH.jwks_uri
    assert rule["audiences"] == ["mlcluster"]
    assert rule["outputClaimToHeaders"] == [{"header": "kubeflow-userid", "claim": "email"}]
    [deny] = [
        m
        for m in manifests
        if m["kind"] == "AuthorizationPolicy" and m["metadata"]["namespace"] == "istio-system"
    ]
    assert deny["spec"]["action"] == "DENY"
    assert deny["spec"]["selector"]["matchLabels"] == selector
    no_principal, no_claim, *forged_headers = deny["spec"]["rules"]
    # On every path (no `to`): the identity or payload header without a verified principal.
    assert forged_headers == [
        {
            "from": [{"source": {"notRequestPrincipals": ["*"]}}],
            "when": [{"key": f"request.headers[{header}]", "values": ["*"]}],
        }
        for header in ("kubeflow-userid", "x-mlcluster-jwt-payload")
    ]
    assert no_principal["from"] == [{"source": {"notRequestPrincipals": ["*"]}}]
    assert no_claim["when"] == [{"key": "request.auth.claims[email]", "notValues": ["*"]}]
    for denied in (no_principal, no_claim):  # the notebook routes, and the shared server's
        assert denied["to"] == [
            {"operation": {"paths": ["/notebook/*", "/notebook", "/jupyter/*", "/jupyter"]}}
        ]
    # TLS: the Gateway serves HTTPS with the platform's certificate and redirects HTTP.
    https, http = gateway["spec"]["servers"]
    assert https["tls"] == {"mode": "SIMPLE", "credentialName": "ml-tls"}
    assert http["tls"] == {"httpsRedirect": True}


@pytest.mark.slow
def test_attack_no_issuer_means_no_open_gateway(capsys: pytest.CaptureFixture[str]) -> None:
    """Without an issuer there is no Gateway at all (it would let Mallory claim any identity),
    and `mlcluster manifests` says why on stderr."""
    assert print_manifests([]) == 0
    captured = capsys.readouterr()
    assert "kind: Gateway" not in captured.out and "RequestAuthentication" not in captured.out
    assert "no Gateway printed" in captured.err and "--oidc-issuer" in captured.err
    assert print_manifests(["--oidc-issuer=https://dex.example.com", "--audience=mlcluster"]) == 0
    captured = capsys.readouterr()
    assert "kind: Gateway" in captured.out and "kind: RequestAuthentication" in captured.out
    assert captured.err == ""
    assert print_manifests(["--no-gateway"]) == 0  # bring your own: no Gateway note
    assert "no Gateway printed" not in capsys.readouterr().err


def _printed_server(documents: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        d
        for d in documents
        if d["kind"] == "Deployment" and d["metadata"]["name"] == "mlcluster-jupyter-server"
    ]


@pytest.mark.slow
def test_attack_issuer_without_an_audience_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    """Red team: with no audience, the gateway (and the server) accepted any token the issuer
    minted for any of its applications. `--oidc-issuer` without `--audience` is now an error,
    saying so, with nothing printed; the builder refuses it too."""
    assert print_manifests(["--oidc-issuer=https://dex.example.com"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "--oidc-issuer needs --audience" in captured.err
    with pytest.raises(ValueError, match="audiences"):
        IngressAuth(issuer="https://dex.example.com")
    with pytest.raises(ValueError, match="audiences"):
        IngressAuth(issuer="https://dex.example.com", audiences=("",))
    argv = ["--oidc-issuer=https://dex.example.com", "--audience=mlcluster", "--audience=cli"]
    assert print_manifests(argv) == 0
    printed = list(yaml.safe_load_all(capsys.readouterr().out))
    [authn] = [d for d in printed if d["kind"] == "RequestAuthentication"]
    assert authn["spec"]["jwtRules"][0]["audiences"] == ["mlcluster", "cli"]
    [server] = _printed_server(printed)
    command = server["spec"]["template"]["spec"]["containers"][0]["command"]
    assert "--MLClusterApp.jwt_audiences=mlcluster" in command
    assert "--MLClusterApp.jwt_audiences=cli" in command


@pytest.mark.slow
def test_attack_no_issuer_prints_no_server_that_believes_a_bare_header(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Red team: without `--oidc-issuer`, `mlcluster manifests` printed the shared server
    believing the identity header with no JWT check. Now it leaves the server out (saying why
    on stderr) unless `--insecure-header-trust` asks for exactly that; with an issuer that
    flag is refused (it would be ignored)."""
    for argv in ([], ["--no-gateway"], ["--user-namespace=team-a"]):
        assert print_manifests(argv) == 0
        captured = capsys.readouterr()
        assert _printed_server(list(yaml.safe_load_all(captured.out))) == [], argv
        assert "no shared Jupyter server printed" in captured.err, argv
        assert "--insecure-header-trust" in captured.err
        assert _printed_server(all_manifests(include_gateway=False)) == []
    assert print_manifests(["--no-gateway", "--insecure-header-trust"]) == 0
    captured = capsys.readouterr()
    [server] = _printed_server(list(yaml.safe_load_all(captured.out)))
    command = server["spec"]["template"]["spec"]["containers"][0]["command"]
    assert "--MLClusterApp.trust_identity_header=True" in command
    assert not any(a.startswith("--MLClusterApp.jwt_issuer") for a in command)
    assert "no shared Jupyter server printed" not in captured.err
    argv = ["--oidc-issuer=https://x.example.com", "--audience=a", "--insecure-header-trust"]
    assert print_manifests(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "--insecure-header-trust" in captured.err


GATEWAY_WORKLOAD = ("istio-system", {"istio": "ingressgateway", "app": "istio-ingressgateway"})


def _server_workload(manifests: list[dict[str, Any]]) -> tuple[str, dict[str, str]]:
    [deployment] = [
        m
        for m in manifests
        if m["kind"] == "Deployment" and m["metadata"]["name"] == "mlcluster-jupyter-server"
    ]
    return deployment["metadata"]["namespace"], deployment["spec"]["template"]["metadata"]["labels"]


@pytest.mark.slow
def test_attack_forged_header_to_the_shared_server_without_a_jwt_is_denied_at_the_gateway() -> None:
    """Mallory sends `kubeflow-userid: alice` to the shared server's route on the gateway with
    no token, or with a token that has no user claim: the gateway's DENY policy covers the
    server's prefix as it covers the notebooks', so the request never reaches the server; a
    verified token (whose claim the gateway writes into the header) goes through. Every path
    the printed route matches is covered."""
    manifests = all_manifests(ingress_auth=AUTH, host="ml.example.com")
    for manifest in manifests:
        _validate(manifest)
    namespace, labels = GATEWAY_WORKLOAD
    [route] = [
        m
        for m in manifests
        if m["kind"] == "VirtualService" and m["metadata"]["name"] == "mlcluster-jupyter-server"
    ]
    assert route["spec"]["gateways"] == ["istio-system/mlcluster-gateway"]
    assert route["spec"]["hosts"] == ["ml.example.com"]
    matched = [
        next(iter(m["uri"].values())) for rule in route["spec"]["http"] for m in rule["match"]
    ]
    assert matched == ["/jupyter/", "/jupyter"]
    forged = {"kubeflow-userid": "alice@example.com"}
    for path in [*matched, "/jupyter/mlcluster/api/jobs", "/jupyter/api/kernels", "/jupyter/lab"]:
        assert not allowed(manifests, namespace, labels, Request(path, headers=forged)), path
        no_claim = Request(
            path, request_principal="https://dex.example.com/mallory", headers=forged
        )
        assert not allowed(manifests, namespace, labels, no_claim), path
        verified = Request(
            path,
            request_principal="https://dex.example.com/alice",
            claims={"email": "alice@example.com"},
            headers={"kubeflow-userid": "alice@example.com"},
        )
        assert allowed(manifests, namespace, labels, verified), path
    # The platform's other routes on the shared ingress workload are not ours to close; but
    # no path carries a client's own identity header past the gateway (red team of issue 31,
    # F1: a user's route on another path may lead to the server: test_attacks_gateway_routes).
    assert allowed(manifests, namespace, labels, Request("/grafana/"))
    assert not allowed(manifests, namespace, labels, Request("/grafana/", headers=forged))


def test_attack_other_routes_on_the_gateway_never_receive_the_raw_token() -> None:
    """Red team: the RequestAuthentication selects the platform-wide ingress gateway, and with
    `forwardOriginalToken: true` every route on it (a user's own backend, any other app)
    received each visitor's raw bearer token, to replay at `/jupyter` as them. The gateway
    now drops the token after verifying it, and passes on only its payload (no signature: no
    credential) in one header, from which the shared server takes the claims it checks
    again (test_jwt_identity.py plays that). Both objects are valid against Istio's CRDs."""
    manifests = all_manifests(ingress_auth=AUTH, host="ml.example.com")
    [authn] = [m for m in manifests if m["kind"] == "RequestAuthentication"]
    validate_istio_upstream(authn)
    [rule] = authn["spec"]["jwtRules"]
    assert rule["forwardOriginalToken"] is False  # Istio's default, said out loud
    assert rule["outputPayloadToHeader"] == "x-mlcluster-jwt-payload"
    assert authn["spec"]["selector"]["matchLabels"] == {"istio": "ingressgateway"}
    [server] = _printed_server(manifests)
    command = server["spec"]["template"]["spec"]["containers"][0]["command"]
    assert "--MLClusterApp.jwt_payload_header=x-mlcluster-jwt-payload" in command
    # The payload header is believed only on requests the gateway verified: /jupyter without
    # a verified principal is denied there (a client's own header never gets through).
    namespace, labels = GATEWAY_WORKLOAD
    forged = {"x-mlcluster-jwt-payload": "eyJpc3MiOiJ4In0", "kubeflow-userid": "alice@example.com"}
    assert not allowed(manifests, namespace, labels, Request("/jupyter/lab", headers=forged))


@pytest.mark.slow
def test_attack_mesh_pod_calls_the_shared_server_with_a_forged_header() -> None:
    """Mallory's notebook or job pod (in the mesh, her namespace's identity) calls the shared
    server's Service directly with `kubeflow-userid: alice`, around the gateway; or a pod
    without a sidecar calls it in plain text. The printed server workload admits only the
    ingress gateway's mTLS identity (ALLOW policy; STRICT mTLS; sidecar injected), so both are
    refused, and the gateway's own forwarded requests pass. It runs as the server's
    least-privilege service account."""
    from notebook_controller.server_rbac import SERVICE_ACCOUNT

    manifests = all_manifests(
        ingress_auth=AUTH, user_namespaces=["alice", "mallory"], server_namespace="hub"
    )
    for manifest in manifests:
        _validate(manifest)
    namespace, labels = _server_workload(manifests)
    assert namespace == "hub" and labels["sidecar.istio.io/inject"] == "true"
    [deployment] = [
        m for m in manifests if m["kind"] == "Deployment" and m["metadata"]["namespace"] == "hub"
    ]
    pod = deployment["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == SERVICE_ACCOUNT
    assert pod["securityContext"]["runAsNonRoot"] is True
    command = pod["containers"][0]["command"]
    assert "--MLClusterApp.trust_identity_header=True" in command
    assert "--ServerApp.base_url=/jupyter/" in command
    # ...and the server checks the gateway's token itself (test_jwt_identity.py plays that),
    # which the gateway passes on.
    assert f"--MLClusterApp.jwt_issuer={AUTH.issuer}" in command
    assert f"--MLClusterApp.jwt_jwks_uri={AUTH.jwks_uri}" in command
    assert "--MLClusterApp.jwt_audiences=mlcluster" in command
    # ...from the payload the gateway verified (the raw token goes to no route).
    assert "--MLClusterApp.jwt_payload_header=x-mlcluster-jwt-payload" in command
    path = "/jupyter/mlcluster/api/jobs"
    forged = {"kubeflow-userid": "alice@example.com"}
    mallory_pod = Request(
        path, principal="cluster.local/ns/mallory/sa/mlcluster-notebook", headers=forged
    )
    assert not allowed(manifests, namespace, labels, mallory_pod)
    controller_pod = Request(
        path, principal="cluster.local/ns/mlcluster-system/sa/notebook-controller", headers=forged
    )
    assert not allowed(manifests, namespace, labels, controller_pod)
    assert not allowed(manifests, namespace, labels, Request(path, headers=forged))  # plain text
    gateway = Request(
        path,
        principal="cluster.local/ns/istio-system/sa/istio-ingressgateway-service-account",
        headers=forged,
    )
    assert allowed(manifests, namespace, labels, gateway)
    [peer] = [
        m
        for m in manifests
        if m["kind"] == "PeerAuthentication" and m["metadata"]["namespace"] == "hub"
    ]
    assert peer["spec"]["mtls"] == {"mode": "STRICT"}
    assert all(labels.get(k) == v for k, v in peer["spec"]["selector"]["matchLabels"].items())
    # The Service reaches the server's pods only (same selector the policies use).
    [service] = [
        m for m in manifests if m["kind"] == "Service" and m["metadata"]["namespace"] == "hub"
    ]
    assert all(labels.get(k) == v for k, v in service["spec"]["selector"].items())


# --- 2. unmeshed pods, plain-text access, privileged pods in user namespaces ---------------------


@pytest.mark.slow
def test_attack_direct_pod_access_is_closed_in_user_namespaces() -> None:
    """Mallory calls `http://nb1.alice.svc/...` from her own pod, around the gateway: the user
    namespace is meshed (sidecars enforce the notebook's AuthorizationPolicy), mTLS is STRICT
    (her plain-text request is refused), and Pod Security baseline is enforced there."""
    manifests = all_manifests(user_namespaces=["alice", "mallory"])
    for manifest in manifests:
        _validate(manifest)
    for namespace in ("alice", "mallory"):
        [ns] = [
            m for m in manifests if m["kind"] == "Namespace" and m["metadata"]["name"] == namespace
        ]
        labels = ns["metadata"]["labels"]
        assert labels["istio-injection"] == "enabled"
        assert labels["pod-security.kubernetes.io/enforce"] in ("baseline", "restricted")
        assert labels[USER_NAMESPACE_LABEL] == "true"
        [peer] = [
            m
            for m in manifests
            if m["kind"] == "PeerAuthentication" and m["metadata"]["namespace"] == namespace
        ]
        assert peer["spec"] == {"mtls": {"mode": "STRICT"}} and "selector" not in peer["spec"]
        # Each user's notebooks run as that namespace's own service account.
        [sa] = [
            m
            for m in manifests
            if m["kind"] == "ServiceAccount" and m["metadata"]["namespace"] == namespace
        ]
        assert sa["metadata"]["name"] == NOTEBOOK_SERVICE_ACCOUNT


# --- 4. privileged / host / foreign-service-account templates -----------------------------------

SERVICE_ACCOUNTS = [NOTEBOOK_SERVICE_ACCOUNT, "default", "default-editor"]
POLICY = admission_policy(SERVICE_ACCOUNTS)


def _notebook() -> dict[str, Any]:
    return objects.notebook_resource("nb1", "mallory", "mallory@example.com", cpu="1")


JOB_KINDS = ["Job", "PyTorchJob", "TFJob"]
# Kinds added for issue 22: every kind whose pod templates reach a user namespace.
MORE_KINDS = [
    "CronJob",
    "StatefulSet",
    "TrainJob/runtimePatches",
    "TrainJob/podSpecOverrides",
    "TrainJob/podTemplateOverrides",
]


def _job(kind: str) -> dict[str, Any]:
    pod = {"spec": {"containers": [{"name": "rank", "image": "python:3.11"}]}}
    meta = {"name": "j", "namespace": "mallory"}
    if kind == "Job":
        return {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": meta,
            "spec": {"template": copy.deepcopy(pod)},
        }
    if kind == "CronJob":
        return {
            "apiVersion": "batch/v1",
            "kind": "CronJob",
            "metadata": meta,
            "spec": {
                "schedule": "0 2 * * *",
                "jobTemplate": {"spec": {"template": copy.deepcopy(pod)}},
            },
        }
    if kind == "StatefulSet":
        return {
            "apiVersion": "apps/v1",
            "kind": "StatefulSet",
            "metadata": meta,
            "spec": {
                "selector": {"matchLabels": {"a": "b"}},
                "serviceName": "j",
                "template": {"metadata": {"labels": {"a": "b"}}, **copy.deepcopy(pod)},
            },
        }
    if kind.startswith("TrainJob/"):
        spec: dict[str, Any] = {"runtimeRef": {"name": "torch-distributed"}}
        where = kind.partition("/")[2]
        if where == "runtimePatches":
            replicated = [{"name": "node", "template": {"spec": {"template": copy.deepcopy(pod)}}}]
            spec["runtimePatches"] = [
                {
                    "manager": "mallory",
                    "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": replicated}}},
                }
            ]
        elif where == "podSpecOverrides":  # Trainer v2.0
            spec["podSpecOverrides"] = [
                {"targetJobs": [{"name": "node"}], **copy.deepcopy(pod["spec"])}
            ]
        else:  # Trainer v2.1
            spec["podTemplateOverrides"] = [
                {"targetJobs": [{"name": "node"}], "spec": copy.deepcopy(pod["spec"])}
            ]
        return {
            "apiVersion": "trainer.kubeflow.org/v1alpha1",
            "kind": "TrainJob",
            "metadata": meta,
            "spec": spec,
        }
    field = "pytorchReplicaSpecs" if kind == "PyTorchJob" else "tfReplicaSpecs"
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": kind,
        "metadata": meta,
        "spec": {
            field: {
                "Master": {"replicas": 1, "template": copy.deepcopy(pod)},
                "Worker": {"replicas": 3, "template": copy.deepcopy(pod)},
            }
        },
    }


def _pod_specs(obj: dict[str, Any]) -> list[dict[str, Any]]:
    if obj["kind"] in ("PyTorchJob", "TFJob"):
        return [r["template"]["spec"] for r in next(iter(obj["spec"].values())).values()]
    if obj["kind"] == "CronJob":
        return [obj["spec"]["jobTemplate"]["spec"]["template"]["spec"]]
    if obj["kind"] == "TrainJob":
        spec = obj["spec"]
        if "runtimePatches" in spec:
            jobs = spec["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]
            return [r["template"]["spec"]["template"]["spec"] for r in jobs["replicatedJobs"]]
        if "podSpecOverrides" in spec:
            return list(spec["podSpecOverrides"])
        return [o["spec"] for o in spec["podTemplateOverrides"]]
    return [obj["spec"]["template"]["spec"]]


ESCALATIONS = {
    "privileged container": lambda s: s["containers"][0].update(
        securityContext={"privileged": True}
    ),
    "privileged init container": lambda s: s.update(
        initContainers=[{"name": "i", "image": "x", "securityContext": {"privileged": True}}]
    ),
    "SYS_ADMIN capability": lambda s: s["containers"][0].update(
        securityContext={"capabilities": {"add": ["SYS_ADMIN"]}}
    ),
    "hostPath of the node's root": lambda s: s.update(
        volumes=[{"name": "root", "hostPath": {"path": "/"}}]
    ),
    "hostNetwork": lambda s: s.update(hostNetwork=True),
    "hostPID": lambda s: s.update(hostPID=True),
    "hostIPC": lambda s: s.update(hostIPC=True),
    "the controller's service account": lambda s: s.update(
        serviceAccountName="notebook-controller"
    ),
    "another service account (deprecated field)": lambda s: s.update(serviceAccount="admin"),
}


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["Notebook", *JOB_KINDS, *MORE_KINDS])
@pytest.mark.parametrize("escalation", sorted(ESCALATIONS))
def test_attack_escalating_pod_templates_are_denied_by_the_admission_policy(
    kind: str, escalation: str
) -> None:
    """Mallory hands the cluster a pod template that would own the node or borrow another
    identity: the shipped policy's CEL denies it (only one replica's template need be bad)."""
    obj = _notebook() if kind == "Notebook" else _job(kind)
    _validate_shape(obj)
    ESCALATIONS[escalation](_pod_specs(obj)[-1])
    assert denials(POLICY, obj), f"{kind} with {escalation} was admitted"


@pytest.mark.parametrize("kind", ["Notebook", *JOB_KINDS, *MORE_KINDS])
def test_benign_templates_are_admitted(kind: str) -> None:
    obj = _notebook() if kind == "Notebook" else _job(kind)
    spec = _pod_specs(obj)[0]
    spec["serviceAccountName"] = NOTEBOOK_SERVICE_ACCOUNT
    spec["containers"][0]["securityContext"] = {
        "privileged": False,
        "runAsNonRoot": True,
        "capabilities": {"add": ["NET_BIND_SERVICE"], "drop": ["ALL"]},
    }
    spec["volumes"] = [{"name": "scratch", "emptyDir": {}}]
    spec["hostNetwork"] = False
    assert denials(POLICY, obj) == []
    assert denials(POLICY, _notebook() if kind == "Notebook" else _job(kind)) == []


# Issue 22: a job pod mounting storage outside the namespace's control as any uid, pinned to
# a node, as root, or reading a Secret the job did not create.
POD_ESCAPES = {
    "nfs volume (a shared home)": lambda s: s.update(
        volumes=[{"name": "home", "nfs": {"server": "nfs.example.com", "path": "/home/alice"}}]
    ),
    "iscsi volume": lambda s: s.update(
        volumes=[
            {
                "name": "disk",
                "iscsi": {"targetPortal": "10.0.0.1:3260", "iqn": "iqn.x:y", "lun": 0},
            }
        ]
    ),
    "csi volume": lambda s: s.update(
        volumes=[{"name": "bucket", "csi": {"driver": "s3.csi.aws.com"}}]
    ),
    "nodeName": lambda s: s.update(nodeName="gpu-node-7"),
    "runAsUser 0 on the pod": lambda s: s.update(securityContext={"runAsUser": 0}),
    "runAsUser 0 on a container": lambda s: s["containers"][0].update(
        securityContext={"runAsUser": 0}
    ),
    "runAsUser 0 on an init container": lambda s: s.update(
        initContainers=[{"name": "i", "image": "x", "securityContext": {"runAsUser": 0}}]
    ),
    # Red team (a): a node by label, field or affinity, as nodeName would; reserved taints.
    "kubernetes.io/hostname nodeSelector": lambda s: s.update(
        nodeSelector={"kubernetes.io/hostname": "gpu-node-7"}
    ),
    "kubernetes.io/hostname required node affinity": lambda s: s.update(
        affinity={
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {
                                    "key": "kubernetes.io/hostname",
                                    "operator": "In",
                                    "values": ["cp-1"],
                                }
                            ]
                        }
                    ]
                }
            }
        }
    ),
    "metadata.name node field": lambda s: s.update(
        affinity={
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {
                            "matchFields": [
                                {"key": "metadata.name", "operator": "In", "values": ["cp-1"]}
                            ]
                        }
                    ]
                }
            }
        }
    ),
    "kubernetes.io/hostname preferred node affinity": lambda s: s.update(
        affinity={
            "nodeAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "weight": 100,
                        "preference": {
                            "matchExpressions": [
                                {
                                    "key": "kubernetes.io/hostname",
                                    "operator": "In",
                                    "values": ["cp-1"],
                                }
                            ]
                        },
                    }
                ]
            }
        }
    ),
    "control-plane toleration": lambda s: s.update(
        tolerations=[
            {
                "key": "node-role.kubernetes.io/control-plane",
                "operator": "Exists",
                "effect": "NoSchedule",
            }
        ]
    ),
    "toleration of every taint (no key)": lambda s: s.update(tolerations=[{"operator": "Exists"}]),
    # Red team (b): root's group.
    "runAsGroup 0 on the pod": lambda s: s.update(securityContext={"runAsGroup": 0}),
    "runAsGroup 0 on a container": lambda s: s["containers"][0].update(
        securityContext={"runAsGroup": 0}
    ),
    "supplementalGroups with 0": lambda s: s.update(
        securityContext={"supplementalGroups": [1000, 0]}
    ),
    "fsGroup 0": lambda s: s.update(securityContext={"fsGroup": 0}),
    # Red team (c): an ephemeral claim that binds a chosen (another user's) volume.
    "ephemeral volume naming a PersistentVolume": lambda s: s.update(
        volumes=[
            {
                "name": "v",
                "ephemeral": {
                    "volumeClaimTemplate": {
                        "spec": {
                            "accessModes": ["ReadWriteOnce"],
                            "volumeName": "pv-alice-home",
                            "resources": {"requests": {"storage": "1Gi"}},
                        }
                    }
                },
            }
        ]
    ),
}
FOREIGN_SECRETS = {
    "secret volume": lambda s: s.update(
        volumes=[{"name": "creds", "secret": {"secretName": "minio-credentials"}}]
    ),
    "projected secret": lambda s: s.update(
        volumes=[
            {"name": "creds", "projected": {"sources": [{"secret": {"name": "default-token"}}]}}
        ]
    ),
    "env secretKeyRef": lambda s: s["containers"][0].update(
        env=[
            {
                "name": "AWS_SECRET_ACCESS_KEY",
                "valueFrom": {"secretKeyRef": {"name": "minio-credentials", "key": "secret"}},
            }
        ]
    ),
    "envFrom secretRef": lambda s: s["containers"][0].update(
        envFrom=[{"secretRef": {"name": "minio-credentials"}}]
    ),
    # The name a payload Secret had before its names carried the job key's token.
    "look-alike payload name": lambda s: s.update(
        volumes=[{"name": "p", "secret": {"secretName": "j-payload-000"}}]
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["Notebook", *JOB_KINDS, *MORE_KINDS])
@pytest.mark.parametrize("escape", sorted(POD_ESCAPES))
def test_attack_job_pods_mount_foreign_storage_pin_a_node_or_run_as_root(
    kind: str, escape: str
) -> None:
    """Mallory's job (any kind a notebook's service account may create, a TrainJob's patches
    and overrides included) or notebook template mounts nfs/iscsi/csi storage (another user's
    home, as any uid), names a node, or runs as root: the shipped policy denies it."""
    obj = _notebook() if kind == "Notebook" else _job(kind)
    POD_ESCAPES[escape](_pod_specs(obj)[-1])
    _validate_shape(obj)
    assert denials(POLICY, obj), f"{kind} with {escape} was admitted"


@pytest.mark.slow
def test_gpu_tolerations_spreading_and_storage_classes_are_admitted() -> None:
    """What the rules above must not refuse: the GPU taint's toleration, node affinity on
    ordinary labels, spreading by hostname (relative, not a chosen node), a non-root group,
    an ephemeral claim by storage class; and the allow-lists are the platform's to set."""
    obj = _job("Job")
    spec = _pod_specs(obj)[0]
    spec["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    spec["nodeSelector"] = {"nvidia.com/gpu.product": "A100"}
    spec["affinity"] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {
                                "key": "topology.kubernetes.io/zone",
                                "operator": "In",
                                "values": ["a"],
                            }
                        ]
                    }
                ]
            }
        },
        "podAntiAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {
                    "weight": 1,
                    "podAffinityTerm": {
                        "topologyKey": "kubernetes.io/hostname",
                        "labelSelector": {"matchLabels": {"a": "b"}},
                    },
                }
            ]
        },
    }
    spec["securityContext"] = {"runAsGroup": 100, "fsGroup": 100, "supplementalGroups": [100]}
    claim = {
        "accessModes": ["ReadWriteOnce"],
        "storageClassName": "fast",
        "resources": {"requests": {"storage": "1Gi"}},
    }
    spec["volumes"] = [{"name": "v", "ephemeral": {"volumeClaimTemplate": {"spec": claim}}}]
    _validate_shape(obj)
    assert denials(POLICY, obj) == []
    # The platform's lists: other taints, and storage classes.
    spot = admission_policy(SERVICE_ACCOUNTS, tolerations=["nvidia.com/gpu", "spot"])
    spec["tolerations"].append({"key": "spot", "operator": "Exists"})
    assert denials(POLICY, obj) and denials(spot, obj) == []
    classes = admission_policy(SERVICE_ACCOUNTS, storage_classes=["standard"])
    spec["tolerations"].pop()
    assert any("storage class" in m for m in denials(classes, obj))
    claim["storageClassName"] = "standard"
    assert denials(classes, obj) == []
    # A StatefulSet's claim templates may not name a volume either.
    stateful = _job("StatefulSet")
    stateful["spec"]["volumeClaimTemplates"] = [
        {"metadata": {"name": "data"}, "spec": {**claim, "volumeName": "pv-alice-home"}}
    ]
    _validate_shape(stateful)
    assert any("volumeName" in m for m in denials(POLICY, stateful))
    del stateful["spec"]["volumeClaimTemplates"][0]["spec"]["volumeName"]
    assert denials(POLICY, stateful) == []


def _in(namespace: str, who: str) -> dict[str, Any]:
    """The admission request's fields the policies read."""
    return {"namespace": namespace, "userInfo": {"username": who}, "operation": "CREATE"}


def _user_namespace_policy(name: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    shipped = all_manifests()
    [policy] = [
        m
        for m in shipped
        if m["kind"] == "ValidatingAdmissionPolicy" and m["metadata"]["name"] == name
    ]
    bindings = [m for m in shipped if m["kind"] == "ValidatingAdmissionPolicyBinding"]
    return policy, bindings


USER_NAMESPACE_KINDS = {
    "ours": {USER_NAMESPACE_LABEL: "true"},
    "a Kubeflow Profile's": {"app.kubernetes.io/part-of": "kubeflow-profile"},
}


@pytest.mark.slow
def test_attack_notebook_account_mints_a_service_account_token_secret() -> None:
    """Red team (d): the notebook's service account may create Secrets (payloads), so Mallory
    creates a `kubernetes.io/service-account-token` Secret with a name the job rules allow,
    annotated with another service account of her namespace: the API server would fill in
    that account's token, and her job could mount it. The shipped policy refuses any type but
    Opaque from the namespace's own service accounts, in our user namespaces and Profiles';
    the builders' own Secrets pass, and the platform (its controllers, people) is not judged."""
    from jupyterlab_mlcluster.backends.kubernetes.schedules import new_secret_name, schedule_secret
    from tests.kube.admission_cel import bound

    policy, bindings = _user_namespace_policy("mlcluster-user-secrets")
    _validate(policy)
    for binding in bindings:
        _validate(binding)
    for labels in USER_NAMESPACE_KINDS.values():
        assert bound(bindings, policy, labels)
    assert not bound(bindings, policy, {"kubernetes.io/metadata.name": "kube-system"})
    token = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": "mlcluster-nightly-0123456789abcdef",  # a name the job rules allow
            "namespace": "mallory",
            "annotations": {"kubernetes.io/service-account.name": "mlcluster-jupyter-server"},
        },
        "type": "kubernetes.io/service-account-token",
    }
    assert validate_builtin_uncached(token) == []
    for account in ("mlcluster-notebook", "default-editor", "default"):
        mallory = _in("mallory", f"system:serviceaccount:mallory:{account}")
        assert denials(policy, token, mallory), account
        for other in ("kubernetes.io/dockerconfigjson", "kubernetes.io/basic-auth"):
            assert denials(policy, {**token, "type": other}, mallory), other
        assert denials(policy, {**token, "type": "Opaque"}, mallory) == []
    # The builders' own Secrets (a schedule's; payloads are the same type).
    row = {"name": "nightly", "owner": "mallory@example.com", "spec": {"workers": 1}}
    own = schedule_secret(row, b"p", namespace="mallory", name=new_secret_name("nightly"))
    assert denials(policy, own, _in("mallory", "system:serviceaccount:mallory:default")) == []
    # Not the namespace's own pods: the platform's controllers and people are not matched.
    for who in ("system:serviceaccount:kubeflow:profiles-controller", "alice@example.com"):
        assert denials(policy, token, _in("mallory", who)) == []


def test_attack_service_exposes_pods_around_the_gateway() -> None:
    """Red team: the notebook's service account may create Services, so Mallory makes a
    NodePort or LoadBalancer Service (her pods, or a notebook's, reachable around the gateway
    and its JWT check) or one with `externalIPs` (CVE-2020-8554: traffic for those addresses
    intercepted). Refused in user namespaces (ours and Profiles'); the ClusterIP and headless
    Services the controller and the jobs make pass."""
    from notebook_controller.config import ControllerConfig
    from tests.kube.admission_cel import bound

    policy, bindings = _user_namespace_policy("mlcluster-user-services")
    _validate(policy)
    for labels in USER_NAMESPACE_KINDS.values():
        assert bound(bindings, policy, labels)
    assert not bound(bindings, policy, {"kubernetes.io/metadata.name": "istio-system"})

    def service(**spec: Any) -> dict[str, Any]:
        made = {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "open", "namespace": "mallory"},
            "spec": {"selector": {"a": "b"}, "ports": [{"port": 80, "targetPort": 8888}], **spec},
        }
        assert validate_builtin_uncached(made) == []
        return made

    for attack in (
        service(type="NodePort"),
        service(type="LoadBalancer"),
        service(externalIPs=["10.0.0.10"]),
        service(type="ClusterIP", externalIPs=["8.8.8.8"]),
    ):
        assert denials(policy, attack), attack["spec"]
    assert denials(policy, service()) == []
    assert denials(policy, service(type="ClusterIP", clusterIP="None")) == []
    notebook = objects.notebook_resource("nb1", "mallory", "mallory@example.com", cpu="1")
    notebook["metadata"]["uid"] = "u1"
    assert denials(policy, objects.service(notebook, ControllerConfig())) == []
    # The Services a job's builders make (rank discovery) pass, whatever the engine.
    from jupyterlab_mlcluster.backends.kubernetes.objects import build_job_objects
    from jupyterlab_mlcluster.jobs.model import JobSpec

    made = []
    for engine in ("indexed-job", "pytorchjob"):
        built = build_job_objects(
            "j3fa9c21b0",
            JobSpec.from_options({"workers": 2}, default_backend="kubernetes"),
            namespace="mallory",
            image="python:3.11",
            user="mallory@example.com",
            payload_chunks=[b"x"],
            engine=engine,
            service_account=NOTEBOOK_SERVICE_ACCOUNT,
            report_key=b"k" * 32,
        )
        made += [o for o in built.all() if o["kind"] == "Service"]
    assert made
    assert all(denials(policy, o) == [] for o in made)


def test_attack_jobs_in_a_kubeflow_profile_namespace_are_judged_too() -> None:
    """Red team: the job binding applied only to namespaces labelled
    `mlcluster.io/user-namespace=true`, so in a Kubeflow Profile's namespace (which the profile
    controller labels `app.kubernetes.io/part-of=kubeflow-profile`, not ours) Mallory's Job
    could be privileged or mount the node. Every user-namespace policy is now bound for
    both labels; the platform's own namespaces stay unjudged; a Profile's notebooks run as
    `default-editor`, whose jobs and schedules pass."""
    from jupyterlab_mlcluster.backends.kubernetes.objects import build_job_objects
    from jupyterlab_mlcluster.jobs.model import JobSpec
    from tests.kube.admission_cel import bound

    shipped = all_manifests()
    [policy] = [
        m
        for m in shipped
        if m["kind"] == "ValidatingAdmissionPolicy"
        and m["metadata"]["name"] == POLICY["metadata"]["name"]
    ]
    bindings = [
        m
        for m in shipped
        if m["kind"] == "ValidatingAdmissionPolicyBinding"
        and m["metadata"]["name"] != "mlcluster-pod-templates-notebooks"
    ]
    profile = USER_NAMESPACE_KINDS["a Kubeflow Profile's"]
    assert bound(bindings, policy, profile)
    assert not bound(bindings, policy, {"kubernetes.io/metadata.name": "kubeflow"})
    privileged = _job("Job")
    ESCALATIONS["privileged container"](_pod_specs(privileged)[0])
    assert denials(policy, privileged)
    spec = JobSpec.from_options({"workers": 2}, default_backend="kubernetes")
    built = build_job_objects(
        "j3fa9c21b0",
        spec,
        namespace="kubeflow-alice",
        image="python:3.11",
        user="alice@example.com",
        payload_chunks=[b"x"],
        engine="indexed-job",
        service_account="default-editor",
        report_key=b"k" * 32,
    )
    assert denials(policy, built.job) == []


@pytest.mark.slow
@pytest.mark.parametrize("kind", [*JOB_KINDS, "CronJob", *MORE_KINDS[2:]])
@pytest.mark.parametrize("secret", sorted(FOREIGN_SECRETS))
def test_attack_job_pods_read_a_secret_the_job_did_not_create(kind: str, secret: str) -> None:
    """Mallory's job reads a Secret of her namespace that the job did not create (the
    platform's storage credentials, a service account token): by volume, projected source,
    env or envFrom, the policy admits only the names its builders give the Secrets they create
    (payload: `<object>-<20 hex>-payload-<NNN>`; schedule: `mlcluster-<schedule>-<16 hex>`)."""
    obj = _job(kind)
    FOREIGN_SECRETS[secret](_pod_specs(obj)[-1])
    _validate_shape(obj)
    assert denials(POLICY, obj), f"{kind} with a {secret} was admitted"


@pytest.mark.slow
def test_attack_trainjob_trainer_env_reads_a_foreign_secret() -> None:
    """A TrainJob names a Secret outside its pod templates: the trainer's env, an
    initializer's env or `secretRef`: refused as in a pod spec."""
    obj = _job("TrainJob/runtimePatches")
    obj["spec"]["trainer"] = {
        "image": "python:3.11",
        "env": [{"name": "T", "valueFrom": {"secretKeyRef": {"name": "minio", "key": "k"}}}],
    }
    assert denials(POLICY, obj)
    obj["spec"]["trainer"]["env"] = [{"name": "T", "value": "plain"}]
    assert denials(POLICY, obj) == []
    # The initializers: a Secret by secretRef (the Trainer mounts it) or by env.
    for part in ("dataset", "model"):
        for initializer in (
            {"storageUri": "hf://x", "secretRef": {"name": "hf-token-of-the-platform"}},
            {
                "storageUri": "s3://x",
                "env": [{"name": "K", "valueFrom": {"secretKeyRef": {"name": "s3", "key": "k"}}}],
            },
        ):
            attacked = copy.deepcopy(obj)
            attacked["spec"]["initializer"] = {part: initializer}
            assert denials(POLICY, attacked), (part, initializer)
        attacked["spec"]["initializer"] = {part: {"storageUri": "hf://public-model"}}
        assert denials(POLICY, attacked) == []


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["indexed-job", "pytorchjob", "tfjob", "trainjob"])
def test_the_builders_own_jobs_and_schedules_pass_the_admission_policy(engine: str) -> None:
    """What the backend really submits (its payload Secrets, volumes, service account) and a
    schedule's CronJob are admitted: the rules refuse only what the builders never make."""
    from jupyterlab_mlcluster.backends.kubernetes.objects import build_job_objects
    from jupyterlab_mlcluster.backends.kubernetes.schedules import (
        new_secret_name,
        schedule_cronjob,
        schedule_secret,
    )
    from jupyterlab_mlcluster.jobs.model import JobSpec

    framework = {"tfjob": "tensorflow", "trainjob": "pytorch"}.get(engine, "none")
    spec = JobSpec.from_options(
        {"workers": 2, "framework": framework, "env": {"A": "1"}}, default_backend="kubernetes"
    )
    built = build_job_objects(
        "j3fa9c21b0",
        spec,
        namespace="alice",
        image="python:3.11",
        user="alice@example.com",
        payload_chunks=[b"x", b"y"],
        engine=engine,
        service_account=NOTEBOOK_SERVICE_ACCOUNT,
        report_key=b"k" * 32,
        runtime="torch-distributed" if engine == "trainjob" else None,
    )
    assert denials(POLICY, built.job) == []
    row = {
        "name": "nightly",
        "owner": "alice@example.com",
        "cron": "0 2 * * *",
        "timezone": "UTC",
        "concurrency": "Forbid",
        "starting_deadline": None,
        "successful_history": 3,
        "failed_history": 1,
        "suspended": False,
        "spec": {"workers": 2, "framework": "none", "backend": "kubernetes"},
    }
    secret = schedule_secret(row, b"p", namespace="alice", name=new_secret_name("nightly"))
    cronjob = schedule_cronjob(
        row, namespace="alice", image="i:1", secret=secret, service_account="mlcluster-notebook"
    )
    assert denials(POLICY, cronjob) == []
    # The StatefulSet the controller makes of a notebook (matched in user namespaces too).
    from notebook_controller.config import ControllerConfig

    notebook = objects.notebook_resource(
        "nb1", "alice", "alice@example.com", cpu="1", workspace_size="5Gi"
    )
    notebook["metadata"]["uid"] = "u1"
    config = ControllerConfig(service_account=NOTEBOOK_SERVICE_ACCOUNT)
    assert denials(POLICY, objects.statefulset(notebook, config)) == []


def _validate_shape(obj: dict[str, Any]) -> None:
    """The attacker's object is one the API server would store (then admission judges it)."""
    if obj["kind"] in ("Job", "CronJob", "StatefulSet"):
        assert validate_builtin_uncached(obj) == []
    # TrainJob: Trainer v2.3's schema allows only some pod fields in runtimePatches (others are
    # pruned, or refused with strict validation): the policy is the line that does not depend
    # on which Trainer version is installed.


@pytest.mark.slow
def test_admission_policy_is_shipped_valid_and_bound() -> None:
    """The policy and its bindings are valid Kubernetes 1.33 objects; Notebooks are checked in
    every namespace, job kinds in the user namespaces, and a denial denies (not just warns)."""
    shipped = all_manifests()
    every = admission_objects(SERVICE_ACCOUNTS)
    assert all(obj in shipped for obj in every)
    for obj in every:
        _validate(obj)
    policy, notebooks, jobs, profile_jobs = every[:4]
    assert policy["spec"]["failurePolicy"] == "Fail"
    for binding in (notebooks, jobs, profile_jobs):
        assert binding["spec"]["validationActions"] == ["Deny"]
        assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    assert "namespaceSelector" not in notebooks["spec"]["matchResources"]
    assert jobs["spec"]["matchResources"]["namespaceSelector"] == {
        "matchLabels": {USER_NAMESPACE_LABEL: "true"}
    }
    assert profile_jobs["spec"]["matchResources"]["namespaceSelector"] == {
        "matchLabels": {"app.kubernetes.io/part-of": "kubeflow-profile"}
    }
    for obj in every[4:]:
        if obj["kind"] == "ValidatingAdmissionPolicy":
            assert obj["spec"]["failurePolicy"] == "Fail"
        else:
            assert obj["spec"]["validationActions"] == ["Deny"]
    # A pod (not a template) is Pod Security's to judge: this policy does not cover pods.
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {"hostPID": True}}
    assert denials(policy, pod) == []


# --- spec.owner: one identity, and the namespace's owner ---------------------------------------

WILDCARD_OWNERS = ["*", "alice*", "*@example.com", "alice, bob", "alice bob", "alice;bob", " alice"]


@pytest.mark.parametrize("owner", WILDCARD_OWNERS)
def test_attack_wildcard_or_list_owner_is_refused_by_the_api_and_the_builder(
    kube: Kube, kube_namespace: str, owner: str
) -> None:
    """Mallory writes `spec.owner: "*"` (Istio's wildcard in the notebook's AuthorizationPolicy:
    everyone admitted), a prefix pattern, a list or a padded name: the CRD's pattern refuses it
    at the API (422, nothing stored), and the builder the server spawns with refuses it too."""
    from tests.kube.controller_support import install_crds

    install_crds(kube)
    body = objects.notebook_resource("nb1", kube_namespace, "mallory@example.com")
    body["spec"]["owner"] = owner
    with pytest.raises(KubeApiError) as refused:
        kube.create(body)
    assert refused.value.status == 422
    assert kube.find(NB, "Notebook", "nb1", kube_namespace) is None
    with pytest.raises(objects.InvalidNotebook, match="one identity"):
        objects.notebook_resource("nb1", kube_namespace, owner)
    assert objects.owner_error("mallory@example.com") is None
    assert objects.owner_error("accounts.google.com:alice@example.com") is None


def test_attack_notebook_for_a_victim_in_the_attackers_namespace_is_refused(
    kube: Kube, kube_namespace: str, controller: Any
) -> None:
    """Mallory, in the namespace she owns (its `mlcluster.io/owner` annotation, or her Kubeflow
    Profile), creates a Notebook whose owner is Alice: its route would put Alice, logged in,
    on pages Mallory serves from the notebooks' origin. The controller makes nothing for it
    and its status says why; Mallory's own notebook there is reconciled. (Which mark decides,
    an agreed Profile, else the annotation: test_namespace_owner_comes_from_the_profile_then_the_annotation.)"""
    from notebook_controller.namespaces import OWNER_ANNOTATION

    kube.patch(
        "v1",
        "Namespace",
        kube_namespace,
        {"metadata": {"annotations": {OWNER_ANNOTATION: "mallory@example.com"}}},
        None,
    )
    with controller():
        create_notebook(kube, kube_namespace, name="lure", workspace=None)  # owner: alice
        kube.create(
            objects.notebook_resource("own", kube_namespace, "mallory@example.com", cpu="1")
        )
        status = wait_phase(kube, kube_namespace, "lure", "error")
        assert "belongs to another user" in status["phase"] + status.get("message", "")
        wait_owned(kube, kube_namespace, "own", count=4)
        time.sleep(1)  # a retry or a second pass would have made something by now
        assert owned(kube, kube_namespace, "lure") == {}


def test_namespace_owner_comes_from_the_profile_then_the_annotation() -> None:
    """A Profile decides whose its namespace is only where the Namespace agrees (Kubeflow's
    `owner` annotation names the Profile's owner; its own status is no evidence); an
    `mlcluster.io/owner` annotation that says otherwise wins, and the refusal says why."""
    from notebook_controller.namespaces import (
        OWNER_ANNOTATION,
        foreign_owner_error,
        namespace_owner,
        namespace_ownership,
    )

    annotated = {"metadata": {"name": "ns", "annotations": {OWNER_ANNOTATION: "mallory"}}}
    profile = {"metadata": {"name": "ns"}, "spec": {"owner": {"kind": "User", "name": "alice"}}}
    kubeflows = {"metadata": {"name": "ns", "annotations": {"owner": "alice"}}}
    bare = {"metadata": {"name": "ns"}}
    assert namespace_owner(annotated, None) == "mallory"
    assert namespace_owner(kubeflows, profile) == "alice"  # Kubeflow made it hers
    ready = {**profile, "status": {"conditions": [{"type": "Ready", "status": "True"}]}}
    assert namespace_owner(bare, ready) is None  # a status the claimant may forge
    marked_hers = {"metadata": {"name": "ns", "annotations": {OWNER_ANNOTATION: "alice"}}}
    assert namespace_ownership(marked_hers, profile) == ("alice", "")  # the platform's mark
    # Issue 31: the Profile is only a claim; the Namespace's own marks say otherwise.
    assert namespace_owner(annotated, profile) == "mallory"
    assert namespace_owner(annotated, ready) == "mallory"
    owner, why = namespace_ownership(annotated, profile)
    assert "belongs to 'mallory'" in why and "not to 'alice'" in why
    assert namespace_owner(bare, profile) is None  # adopted by nobody: the Profile is nothing
    assert "no 'owner' annotation" in namespace_ownership(bare, profile)[1]
    bobs = {"metadata": {"name": "ns", "annotations": {"owner": "bob"}}}
    assert namespace_owner(bobs, profile) is None
    gone = {**profile, "metadata": {"name": "ns", "deletionTimestamp": "2026-01-01T00:00:00Z"}}
    assert namespace_owner(annotated, gone) == "mallory"
    assert namespace_owner({"metadata": {"name": "shared"}}, None) is None
    assert foreign_owner_error("alice", "ns", "alice") is None
    assert foreign_owner_error("alice", "shared", None) is None  # a namespace users share
    assert "belongs to another user" in (foreign_owner_error("alice", "ns", "mallory") or "")
    said = foreign_owner_error("alice", "ns", "mallory", why) or ""
    assert said.endswith(why)


def test_attack_a_profile_named_after_anothers_namespace_gives_its_owner_nothing_there(
    kube: Kube, kube_namespace: str, controller: Any
) -> None:
    """Issue 31, 1 (the controller's side): Alice's namespace (`mlcluster.io/owner: alice`),
    and Mallory's Profile of the same name, which Kubeflow would refuse to adopt but which
    stays. The controller took the Profile's word: Alice's notebooks there were refused and
    Mallory's reconciled. Now the annotation wins: Alice's notebook gets its objects,
    Mallory's gets none, and its status says why the Profile did not count."""
    from notebook_controller.namespaces import OWNER_ANNOTATION
    from tests.kube.notebooks_api.test_user_namespaces import profile_crd

    kube.install_crd(profile_crd())
    kube.patch(
        "v1",
        "Namespace",
        kube_namespace,
        {"metadata": {"annotations": {OWNER_ANNOTATION: "alice@example.com"}}},
        None,
    )
    claim = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "Profile",
        "metadata": {"name": kube_namespace},
        "spec": {"owner": {"kind": "User", "name": "mallory@example.com"}},
    }
    kube.create(claim)
    try:
        with controller():
            create_notebook(kube, kube_namespace, name="hers", workspace=None)  # owner: alice
            kube.create(
                objects.notebook_resource("squat", kube_namespace, "mallory@example.com", cpu="1")
            )
            status = wait_phase(kube, kube_namespace, "squat", "error")
            said = status["phase"] + status.get("message", "")
            assert "belongs to another user" in said and "Profile not counted" in said, said
            assert "belongs to 'alice@example.com'" in said, said
            wait_owned(kube, kube_namespace, "hers", count=4)
            time.sleep(1)  # a retry or a second pass would have made something by now
            assert owned(kube, kube_namespace, "squat") == {}
    finally:
        kube.delete("kubeflow.org/v1", "Profile", kube_namespace)
        kube.uninstall_crd(profile_crd()["metadata"]["name"])


# --- 3. hijacking another notebook's objects (shared namespace) ----------------------------------


def test_attack_precreated_service_is_not_adopted(
    kube: Kube, kube_namespace: str, controller: Any
) -> None:
    """Mallory creates the Service `nb1` (selecting her own pod) before Alice's notebook: the
    controller never adopts it (it finds its objects by ownerReference uid), leaves it exactly
    as it was, and Alice's notebook reports the conflict."""
    trap = kube.create(
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {
                "name": "nb1",
                "namespace": kube_namespace,
                "labels": {objects.LABEL_NOTEBOOK: "nb1"},
            },
            "spec": {"selector": {"app": "mallory"}, "ports": [{"port": 80, "targetPort": 9999}]},
        }
    )
    with controller():
        create_notebook(kube, kube_namespace, workspace=None)
        status = wait_phase(kube, kube_namespace, "nb1", "error")
        assert "Service nb1 exists and does not belong to this notebook" in status["phase"]
        time.sleep(1)
        after = kube.get("v1", "Service", "nb1", kube_namespace)
        assert after["metadata"]["resourceVersion"] == trap["metadata"]["resourceVersion"]
        assert after["spec"]["selector"] == {"app": "mallory"}
        assert not after["metadata"].get("ownerReferences")
        # Alice's other objects are made and hers.
        sts = kube.get("apps/v1", "StatefulSet", "nb1", kube_namespace)
        uid = kube.get(NB, "Notebook", "nb1", kube_namespace)["metadata"]["uid"]
        assert [r["uid"] for r in sts["metadata"]["ownerReferences"]] == [uid]


def test_attack_lookalike_pod_does_not_set_the_status(
    kube: Kube, kube_namespace: str, controller: Any
) -> None:
    """Mallory labels her own Running, Ready pod as Alice's notebook pod: Alice's notebook
    stays `starting` (the controller reads only pods its own StatefulSet owns)."""
    with controller():
        create_notebook(kube, kube_namespace, workspace=None)
        wait_owned(kube, kube_namespace, "nb1", count=4)
        kube.create(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": "nb1-0",
                    "namespace": kube_namespace,
                    "labels": {objects.LABEL_NOTEBOOK: "nb1"},
                },
                "spec": {"containers": [{"name": "evil", "image": "mallory/evil:1"}]},
            }
        )
        kube.set_pod_phase(kube_namespace, "nb1-0", "Running", ready=True)
        time.sleep(1.5)
        status = kube.get(NB, "Notebook", "nb1", kube_namespace)["status"]
        assert status["phase"] == "starting" and status["ready"] is False


def test_attack_stop_of_a_replaced_notebook_is_refused(kube: Kube, kube_namespace: str) -> None:
    """A stop decided on Alice's notebook never lands on a notebook of the same name made
    since (by Mallory, after Alice deleted hers), nor on one changed since it was read: the
    JSON patch tests uid and resourceVersion; the other object is left untouched."""
    from tests.kube.controller_support import install_crds

    install_crds(kube)
    alice = create_notebook(kube, kube_namespace, workspace=None)
    now = datetime.datetime.now(datetime.UTC)

    def guarded_stop(read: dict, stop: bool) -> dict:
        """The controller's stop/start write, guarded by what it read."""
        return kube.patch(
            NB,
            "Notebook",
            "nb1",
            objects.guarded_stop_patch(read, stop, now),
            kube_namespace,
            content_type="application/json-patch+json",
        )

    kube.delete(NB, "Notebook", "nb1", kube_namespace)
    kube.wait_for(lambda: kube.find(NB, "Notebook", "nb1", kube_namespace) is None)
    mallory = kube.create(objects.notebook_resource("nb1", kube_namespace, "mallory@example.com"))
    with pytest.raises(KubeApiError) as refused:
        guarded_stop(alice, True)  # read before Alice's notebook was replaced
    assert refused.value.status == 422
    after = kube.get(NB, "Notebook", "nb1", kube_namespace)
    assert after["metadata"]["resourceVersion"] == mallory["metadata"]["resourceVersion"]
    assert not objects.is_stopped(after)
    # Changed since read (same uid): refused as well; read again, it applies.
    kube.patch(NB, "Notebook", "nb1", {"metadata": {"labels": {"x": "y"}}}, kube_namespace)
    with pytest.raises(KubeApiError):
        guarded_stop(mallory, True)
    stopped = guarded_stop(kube.get(NB, "Notebook", "nb1", kube_namespace), True)
    assert objects.is_stopped(stopped)
    started = guarded_stop(stopped, False)
    assert not objects.is_stopped(started)


# --- the controller's activity probe against a hostile notebook pod ---------------------------


def test_attack_activity_probe_is_redirected_or_flooded_by_the_notebook_pod() -> None:
    """Mallory's notebook server (a real HTTP server here) answers the controller's activity
    probe with a redirect to an internal service (blind SSRF with the controller's identity),
    or with an endless valid-JSON body (the controller's memory). The probe follows no
    redirect (the target is never called) and stops reading after MAX_BODY bytes; both are a
    failed probe (never a cull), and an honest server is still read."""
    import asyncio

    import aiohttp
    from aiohttp import web

    from notebook_controller.culling import MAX_BODY, ProbeError, probe_activity

    now = datetime.datetime.now(datetime.UTC).isoformat()
    internal_calls: list[str] = []
    streamed: dict[str, Any] = {"bytes": 0, "finished": False}

    async def internal(request: web.Request) -> web.Response:
        internal_calls.append(request.path)
        return web.json_response({"last_activity": now, "connections": 0})

    async def redirect(request: web.Request) -> web.Response:
        raise web.HTTPFound(f"/internal/{request.match_info['what']}")

    async def flood(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()  # chunked: no length announced
        response.content_type = "application/json"
        await response.prepare(request)
        total = 64 * 1024 * 1024
        try:
            await response.write(b'{"last_activity": "' + now.encode() + b'", "pad": "')
            chunk = b"x" * (256 * 1024)
            while streamed["bytes"] < total:
                await response.write(chunk)
                streamed["bytes"] += len(chunk)
            await response.write(b'"}')
            streamed["finished"] = True
        finally:
            ended.set()
        return response

    async def honest(request: web.Request) -> web.Response:
        what = request.match_info["what"]
        return web.json_response({"last_activity": now} if what == "status" else [])

    async def main() -> None:
        app = web.Application()
        app.router.add_get("/internal/api/{what}", internal)
        app.router.add_get("/redirect/api/{what}", redirect)
        app.router.add_get("/flood/api/{what}", flood)
        app.router.add_get("/honest/api/{what}", honest)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        base = f"http://127.0.0.1:{port}"
        try:
            async with aiohttp.ClientSession() as session:
                with pytest.raises(ProbeError, match="redirects are not followed"):
                    await probe_activity(session, f"{base}/redirect/", 10)
                assert internal_calls == []
                with pytest.raises(ProbeError, match=f"more than {MAX_BODY} bytes"):
                    await probe_activity(session, f"{base}/flood/", 30)
                activity = await probe_activity(session, f"{base}/honest/", 10)
                assert activity.kernels == 0 and not activity.busy
            await asyncio.wait_for(ended.wait(), 30)
            assert not streamed["finished"], "the controller read the whole flood"
        finally:
            await runner.cleanup()

    ended = asyncio.Event()
    asyncio.run(main())


# --- least privilege: a compromised controller -------------------------------------------------


def test_attack_compromised_controller_writes_outside_the_user_namespaces() -> None:
    """Whoever takes over the controller's service account tries to rewrite the ingress
    (istio-system's Gateway policies), start a StatefulSet in kube-system, read Secrets, or
    delete what it reconciles: the printed RBAC (evaluated as the API server's RBAC authorizer
    does) grants writes only in the user namespaces, cluster-wide only reads, never Secrets."""
    from tests.kube.rbac_authz import can

    printed = all_manifests(ingress_auth=AUTH, user_namespaces=["alice", "mallory"])
    controller = ("mlcluster-system", "notebook-controller")
    for namespace in ("istio-system", "kube-system", "mlcluster-system", "default", None):
        for verb, group, resource in [
            ("create", "security.istio.io", "authorizationpolicies"),
            ("patch", "security.istio.io", "authorizationpolicies"),
            ("patch", "networking.istio.io", "virtualservices"),
            ("create", "apps", "statefulsets"),
            ("patch", "", "services"),
            ("create", "", "events"),
            ("patch", "mlcluster.io", "notebooks"),
        ]:
            assert not can(printed, controller, verb, group, resource, namespace), (
                verb,
                resource,
                namespace,
            )
    for namespace in ("alice", "istio-system", None):
        assert not can(printed, controller, "get", "", "secrets", namespace)
        assert not can(printed, controller, "list", "", "secrets", namespace)
        assert not can(printed, controller, "delete", "apps", "statefulsets", namespace)
        assert not can(printed, controller, "delete", "mlcluster.io", "notebooks", namespace)
    # What it is for: its children in the user namespaces, its Lease at home, reads anywhere.
    for namespace in ("alice", "mallory"):
        assert can(printed, controller, "create", "apps", "statefulsets", namespace)
        assert can(
            printed, controller, "patch", "security.istio.io", "authorizationpolicies", namespace
        )
        assert can(printed, controller, "patch", "mlcluster.io", "notebooks/status", namespace)
    assert can(printed, controller, "watch", "mlcluster.io", "notebooks", None)
    lease = ("coordination.k8s.io", "leases")
    assert can(printed, controller, "get", *lease, "mlcluster-system", "notebook-controller")
    assert not can(printed, controller, "get", *lease, "kube-system", "notebook-controller")


@pytest.mark.slow
def test_manifests_mark_each_user_namespace_with_its_owner(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`--namespace-owner` marks a printed user namespace with its owner, the mark the
    controller reads; an owner that is not one identity, or a namespace that is not a user
    namespace, is refused with nothing printed."""
    import yaml

    from notebook_controller.namespaces import namespace_owner

    argv = ["--no-gateway", "--user-namespace=team-a", "--user-namespace=team-b"]
    assert print_manifests([*argv, "--namespace-owner", "team-a=alice@example.com"]) == 0
    printed = list(yaml.safe_load_all(capsys.readouterr().out))
    namespaces = {m["metadata"]["name"]: m for m in printed if m["kind"] == "Namespace"}
    for namespace in namespaces.values():
        _validate(namespace)
    assert namespace_owner(namespaces["team-a"], None) == "alice@example.com"
    assert namespace_owner(namespaces["team-b"], None) is None  # shared: nobody said
    for bad in ("team-a=*", "team-a=alice bob", "team-z=alice"):
        assert print_manifests([*argv, "--namespace-owner", bad]) != 0
        captured = capsys.readouterr()
        assert captured.out == "" and "--namespace-owner" in captured.err


@pytest.mark.slow
def test_the_platform_sets_the_allow_lists_on_the_command_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`--allowed-toleration` (repeatable, replacing the GPU default) and
    `--allowed-storage-class` reach the printed policy: no option is silently ignored."""
    argv = ["--no-gateway", "--allowed-toleration=spot", "--allowed-toleration=nvidia.com/gpu"]
    assert print_manifests([*argv, "--allowed-storage-class=standard"]) == 0
    printed = list(yaml.safe_load_all(capsys.readouterr().out))
    [policy] = [
        d
        for d in printed
        if d["kind"] == "ValidatingAdmissionPolicy"
        and d["metadata"]["name"] == POLICY["metadata"]["name"]
    ]
    assert policy == admission_policy(
        SERVICE_ACCOUNTS, tolerations=["spot", "nvidia.com/gpu"], storage_classes=["standard"]
    )
    assert print_manifests(["--no-gateway"]) == 0
    printed = list(yaml.safe_load_all(capsys.readouterr().out))
    assert POLICY in printed
