"""Issue 31: what reaches a route behind the gateway, played as attacks on the printed layout.

- A token in the query string (`?access_token=`, one of Istio's default token locations) is no
  credential at the gateway: tokens come from the Authorization header only, which the gateway
  drops (the shared server refuses one left in a URL: test_shared_server_closed.py).
- A VirtualService of another namespace binds to the Gateway and writes the identity header
  (`headers.request.set`) after the JWT filter: the printed Gateway's hosts are
  `<namespace>/<host>` for the platform's namespaces only, so such a route does not bind; in
  a user namespace, where one may bind, a route that writes the identity headers is refused
  by the `mlcluster-user-routes` policy (its CEL evaluated as the API server does).

Istio's binding rule (https://istio.io/latest/docs/reference/config/networking/gateway/, the
`hosts` field): a VirtualService binds to a Gateway server when one of the server's hosts
matches the route's host and its namespace part is `*`, the route's namespace, or `.` (the
Gateway's own).
"""

from __future__ import annotations

from typing import Any

import jsonschema
import pytest
import yaml

from notebook_controller import objects
from notebook_controller.admission import admission_objects
from notebook_controller.cli import print_manifests
from notebook_controller.config import ControllerConfig
from notebook_controller.ingress import IngressAuth
from notebook_controller.manifests import all_manifests
from notebook_controller.namespaces import PROFILE_NAMESPACE_LABELS, USER_NAMESPACE_LABEL
from tests.kube.admission_cel import bound, denials
from tests.kube.istio import SPEC_SCHEMAS, strict_json_schema
from tests.kube.istio_upstream import validate_istio_upstream
from tests.kube.validation import validate_builtin_uncached

AUTH = IngressAuth(
    issuer="https://dex.example.com",
    jwks_uri="https://dex.example.com/keys",
    audiences=("mlcluster",),
    owner_header="kubeflow-userid",
)
HOST = "ml.example.com"


def _host_matches(pattern: str, host: str) -> bool:
    if pattern == "*":
        return True
    if pattern.startswith("*."):
        return host.endswith(pattern[1:])
    return pattern == host


def binds(gateway: dict[str, Any], namespace: str, host: str) -> bool:
    """Whether a VirtualService in `namespace` for `host` binds to `gateway` (Istio's rule)."""
    for server in gateway["spec"]["servers"]:
        for entry in server["hosts"]:
            where, _, pattern = entry.rpartition("/")
            allowed = {"", "*", namespace} | (
                {"."} if namespace == gateway["metadata"]["namespace"] else set()
            )
            if where in allowed and _host_matches(pattern, host):
                return True
    return False


def test_attack_a_token_in_the_query_string_is_no_credential_at_the_gateway() -> None:
    """Istio's RequestAuthentication takes a token from `?access_token=` as well as from the
    Authorization header unless told otherwise; one in the URL stays there, for every route
    behind the gateway and its access logs. The printed one names the header alone, valid
    against Istio's CRD."""
    manifests = all_manifests(ingress_auth=AUTH, host=HOST)
    [authn] = [m for m in manifests if m["kind"] == "RequestAuthentication"]
    validate_istio_upstream(authn)
    [rule] = authn["spec"]["jwtRules"]
    assert rule["fromHeaders"] == [{"name": "Authorization", "prefix": "Bearer "}]
    assert "fromParams" not in rule
    assert rule["forwardOriginalToken"] is False  # and the header token is dropped


def test_attack_a_route_of_another_namespace_cannot_bind_to_the_gateway(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Mallory, in a namespace of her own, makes a VirtualService on the printed Gateway that
    routes `/steal/` to Alice's notebook (or the shared server) with `headers.request.set:
    {kubeflow-userid: alice}`: the notebook's policy admits what comes from the gateway with
    her name. The Gateway's hosts bind routes of the server's namespace, the user namespaces
    and the namespaces the platform names (`--route-namespace`) only; the server's route and
    the controller's notebook routes still bind."""
    manifests = all_manifests(
        ingress_auth=AUTH,
        host=HOST,
        tls_secret="ml-tls",
        user_namespaces=["alice", "bob"],
        server_namespace="hub",
        route_namespaces=["kf-carol"],
    )
    [gateway] = [m for m in manifests if m["kind"] == "Gateway"]
    validate_istio_upstream(gateway)
    for server in gateway["spec"]["servers"]:
        assert server["hosts"] == [f"{ns}/{HOST}" for ns in ("hub", "alice", "bob", "kf-carol")]
    assert not binds(gateway, "mallory", HOST)
    assert not binds(gateway, "istio-system", HOST)  # not even the gateway's own namespace
    [server_route] = [m for m in manifests if m["kind"] == "VirtualService"]
    assert binds(gateway, server_route["metadata"]["namespace"], server_route["spec"]["hosts"][0])
    config = ControllerConfig(host=HOST)
    for namespace in ("alice", "kf-carol"):
        notebook = objects.notebook_resource("nb1", namespace, f"{namespace}@example.com")
        notebook["metadata"]["uid"] = "u1"
        route = objects.virtual_service(notebook, config, "v1")
        assert binds(gateway, namespace, route["spec"]["hosts"][0]), namespace
    # From the command line too.
    argv = ["--oidc-issuer=https://dex.example.com", "--audience=mlcluster", f"--host={HOST}"]
    assert print_manifests([*argv, "--route-namespace=kf-carol"]) == 0
    [printed] = [d for d in yaml.safe_load_all(capsys.readouterr().out) if d["kind"] == "Gateway"]
    assert printed["spec"]["servers"][0]["hosts"] == [
        f"mlcluster-system/{HOST}",
        f"kf-carol/{HOST}",
    ]
    assert print_manifests([*argv, "--route-namespace=Not_A_Namespace"]) != 0
    captured = capsys.readouterr()
    assert captured.out == "" and "--route-namespace" in captured.err


def _route(**where: Any) -> dict[str, Any]:
    http: dict[str, Any] = {
        "match": [{"uri": {"prefix": "/steal/"}}],
        "rewrite": {"uri": "/notebook/alice/nb1/"},
        "route": [{"destination": {"host": "nb1.alice.svc.cluster.local"}}],
    }
    if "http" in where:
        http["headers"] = {"request": where["http"]}
    if "route" in where:
        http["route"][0]["headers"] = {"request": where["route"]}
    return {
        "apiVersion": "networking.istio.io/v1",
        "kind": "VirtualService",
        "metadata": {"name": "steal", "namespace": "mallory"},
        "spec": {"hosts": ["*"], "gateways": ["istio-system/mlcluster-gateway"], "http": [http]},
    }


FORGING_ROUTES = {
    "set the identity header": {"http": {"set": {"kubeflow-userid": "alice@example.com"}}},
    "set it in other letters": {"http": {"set": {"KubeFlow-UserID": "alice@example.com"}}},
    "add it on a destination": {"route": {"add": {"kubeflow-userid": "alice@example.com"}}},
    "set the payload header": {"http": {"set": {"x-mlcluster-jwt-payload": "eyJlbWFpbCI6ImEifQ"}}},
    "set another identity header name": {"route": {"set": {"x-forwarded-user": "alice"}}},
}


@pytest.mark.parametrize("forgery", sorted(FORGING_ROUTES))
def test_attack_a_route_in_a_user_namespace_cannot_write_the_identity_headers(
    forgery: str,
) -> None:
    """In a user namespace (which binds to the Gateway for its notebooks' routes), Mallory may
    create VirtualServices where the platform lets her (Kubeflow's `kubeflow-edit` does in a
    Profile's namespace): one that writes the identity header or the gateway's payload header,
    in any letters, on the route or on a destination, is refused; one writing other headers,
    and the controller's own notebook routes, pass."""
    header = "x-forwarded-user" if "another" in forgery else "kubeflow-userid"
    printed = admission_objects(["mlcluster-notebook"], identity_header=header)
    [policy] = [
        m
        for m in printed
        if m["kind"] == "ValidatingAdmissionPolicy"
        and m["metadata"]["name"] == "mlcluster-user-routes"
    ]
    bindings = [m for m in printed if m["kind"] == "ValidatingAdmissionPolicyBinding"]
    assert validate_builtin_uncached(policy) == []
    assert bound(bindings, policy, {USER_NAMESPACE_LABEL: "true"})
    assert bound(bindings, policy, dict(PROFILE_NAMESPACE_LABELS))
    forged = _route(**FORGING_ROUTES[forgery])
    jsonschema.validate(forged["spec"], strict_json_schema(SPEC_SCHEMAS["VirtualService"]))
    assert denials(policy, forged), f"a route that does '{forgery}' was admitted"
    harmless = _route(http={"set": {"x-request-source": "mallory"}}, route={"remove": [header]})
    assert denials(policy, harmless) == []
    notebook = objects.notebook_resource("nb1", "mallory", "mallory@example.com")
    notebook["metadata"]["uid"] = "u1"
    assert denials(policy, objects.virtual_service(notebook, ControllerConfig(), "v1")) == []


def test_the_printed_policy_names_the_configured_identity_header() -> None:
    manifests = all_manifests(ingress_auth=AUTH, owner_header="x-auth-user")
    [policy] = [
        m
        for m in manifests
        if m["kind"] == "ValidatingAdmissionPolicy"
        and m["metadata"]["name"] == "mlcluster-user-routes"
    ]
    forged = _route(http={"set": {"X-Auth-User": "alice"}})
    assert denials(policy, forged)
    assert denials(policy, _route(http={"set": {"kubeflow-userid": "alice"}})) == []
