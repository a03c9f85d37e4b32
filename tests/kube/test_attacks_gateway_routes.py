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


@pytest.mark.slow
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
        "match": [{"uri": {"prefix": "/notebook/mallory/steal/"}}],
        "rewrite": {"uri": "/notebook/mallory/nb1/"},
        "route": [{"destination": {"host": "nb1.mallory.svc.cluster.local"}}],
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


@pytest.mark.slow
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


def _user_routes_policy() -> dict[str, Any]:
    [policy] = [
        m
        for m in admission_objects(["mlcluster-notebook"])
        if m["kind"] == "ValidatingAdmissionPolicy"
        and m["metadata"]["name"] == "mlcluster-user-routes"
    ]
    return policy


def _vs(namespace: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "networking.istio.io/v1",
        "kind": "VirtualService",
        "metadata": {"name": "mine", "namespace": namespace},
        "spec": {"hosts": ["*"], "gateways": ["istio-system/mlcluster-gateway"], **spec},
    }


OWN_DEST = [{"destination": {"host": "evil.team-b.svc.cluster.local", "port": {"number": 80}}}]
SERVER_DEST = [
    {"destination": {"host": "mlcluster-jupyter-server.mlcluster-system.svc.cluster.local"}}
]
ESCAPING_ROUTES: dict[str, dict[str, Any]] = {
    # F2: another user's URL on the shared origin (Istio merges routes oldest first).
    "a prefix of team-a's namespace": {
        "http": [{"match": [{"uri": {"prefix": "/notebook/team-a/"}}], "route": OWN_DEST}]
    },
    "a regex over every namespace": {
        "http": [{"match": [{"uri": {"regex": "/notebook/[^/]+/.*"}}], "route": OWN_DEST}]
    },
    "the shared server's path": {
        "http": [{"match": [{"uri": {"prefix": "/jupyter/lab"}}], "route": OWN_DEST}]
    },
    "an exact path of team-a": {
        "http": [{"match": [{"uri": {"exact": "/notebook/team-a/nb"}}], "route": OWN_DEST}]
    },
    "a rule with no match (catch-all)": {"http": [{"route": OWN_DEST}]},
    "a match on headers alone": {
        "http": [{"match": [{"headers": {"x": {"exact": "y"}}}], "route": OWN_DEST}]
    },
    "a prefix with a prefix of its namespace's name": {
        "http": [{"match": [{"uri": {"prefix": "/notebook/team-b"}}], "route": OWN_DEST}]
    },
    "a prefix climbing out with ..": {
        "http": [{"match": [{"uri": {"prefix": "/notebook/team-b/../team-a/"}}], "route": OWN_DEST}]
    },
    # F1: around the gateway's token requirement, to the shared server or team-a's notebook.
    "its own path rewritten to /jupyter/, to the server": {
        "http": [
            {
                "match": [{"uri": {"prefix": "/notebook/team-b/x/"}}],
                "rewrite": {"uri": "/jupyter/"},
                "route": SERVER_DEST,
            }
        ]
    },
    "another path to the server": {
        "http": [
            {
                "match": [{"uri": {"prefix": "/bob-x/"}}],
                "rewrite": {"uri": "/jupyter/"},
                "route": SERVER_DEST,
            }
        ]
    },
    "its own path to team-a's notebook": {
        "http": [
            {
                "match": [{"uri": {"prefix": "/notebook/team-b/y/"}}],
                "route": [{"destination": {"host": "nb.team-a.svc.cluster.local"}}],
            }
        ]
    },
    "its own path to the server by short namespace form": {
        "http": [
            {
                "match": [{"uri": {"prefix": "/notebook/team-b/y/"}}],
                "route": [{"destination": {"host": "mlcluster-jupyter-server.mlcluster-system"}}],
            }
        ]
    },
    "a regex rewrite": {
        "http": [
            {
                "match": [{"uri": {"prefix": "/notebook/team-b/y/"}}],
                "rewrite": {"uriRegexRewrite": {"match": ".*", "rewrite": "/jupyter/"}},
                "route": OWN_DEST,
            }
        ]
    },
    "a delegation": {
        "http": [
            {
                "match": [{"uri": {"prefix": "/notebook/team-b/y/"}}],
                "delegate": {"name": "server", "namespace": "mlcluster-system"},
            }
        ]
    },
    "a mirror to team-a's notebook": {
        "http": [
            {
                "match": [{"uri": {"prefix": "/notebook/team-b/y/"}}],
                "route": OWN_DEST,
                "mirror": {"host": "nb.team-a.svc.cluster.local"},
            }
        ]
    },
    "a tcp route to the server": {"tcp": [{"route": SERVER_DEST}]},
}


@pytest.mark.slow
@pytest.mark.parametrize("escape", sorted(ESCAPING_ROUTES))
def test_attack_a_route_in_a_user_namespace_stays_under_its_own_path_and_namespace(
    escape: str,
) -> None:
    """Red team of issue 31, F1 and F2: Bob (allowed VirtualServices in team-b, which the
    Gateway binds) claimed team-a's notebook URL or the shared server's on the shared host
    (a prefix, a regex, `/jupyter/lab`, a catch-all: Istio merges routes oldest first, so his
    served Alice's URL with her cookies), or routed a path the gateway's token requirement
    does not name, rewritten, to the shared server or Alice's notebook (then a forged
    identity header reached them). Each is refused; Bob's routes under
    `/notebook/team-b/` to his own Services, and the controller's notebook routes, pass."""
    policy = _user_routes_policy()
    # Fields as Istio's VirtualService reference documents them (delegate, mirror,
    # uriRegexRewrite, tcp are outside tests/kube/istio.py's subset of the schema).
    attack = _vs("team-b", ESCAPING_ROUTES[escape])
    assert denials(policy, attack), f"a route with {escape} was admitted"
    own = _vs(
        "team-b",
        {
            "http": [
                {
                    "match": [
                        {"uri": {"prefix": "/notebook/team-b/board/"}},
                        {"uri": {"exact": "/notebook/team-b/board"}},
                    ],
                    "rewrite": {"uri": "/notebook/team-b/board/"},
                    "route": [
                        {"destination": {"host": "board"}},
                        {"destination": {"host": "board.team-b"}},
                        {"destination": {"host": "board.team-b.svc.cluster.local"}},
                    ],
                    "mirror": {"host": "audit.team-b.svc"},
                }
            ]
        },
    )
    assert denials(policy, own) == []
    for namespace in ("team-b", "kf-carol"):
        notebook = objects.notebook_resource("nb1", namespace, "bob@example.com")
        notebook["metadata"]["uid"] = "u1"
        assert denials(policy, objects.virtual_service(notebook, ControllerConfig(), "v1")) == []


def test_attack_a_forged_identity_header_is_refused_at_the_gateway_on_every_path() -> None:
    """Red team of issue 31, F1, the gateway's side: its token requirement named the notebook
    and server paths only, and the JWT filter writes the identity and payload headers over a
    client's only when a token was verified; any route on another path that led to the
    server (a route of another Gateway on the same workload, a user's route before the route
    policy) carried `kubeflow-userid: alice` and an unsigned payload to it. The gateway now
    refuses either header without a verified principal on every path; requests without them
    on other paths, and verified ones, pass. (Istio's AuthorizationPolicy semantics as
    documented, evaluated by tests/kube/istio_authz.py; not run against a real Envoy here.)"""
    from tests.kube.istio_authz import Request, allowed

    manifests = all_manifests(ingress_auth=AUTH, host=HOST)
    [policy] = [
        m
        for m in manifests
        if m["kind"] == "AuthorizationPolicy" and m["metadata"]["name"].endswith("require-jwt")
    ]
    validate_istio_upstream(policy)
    workload = policy["metadata"]["namespace"], policy["spec"]["selector"]["matchLabels"]
    payload = "eyJpc3MiOiJodHRwczovL2RleC5leGFtcGxlLmNvbSIsImVtYWlsIjoiYWxpY2UifQ"
    for path in ("/bob-x/mlcluster/api/jobs", "/", "/grafana/", "/notebook-x/"):
        for headers in (
            {"kubeflow-userid": "alice@example.com"},
            {"x-mlcluster-jwt-payload": payload},
        ):
            assert not allowed(manifests, *workload, Request(path, headers=headers)), (
                path,
                headers,
            )
        assert allowed(manifests, *workload, Request(path))
        verified = Request(
            path,
            request_principal="https://dex.example.com/alice",
            claims={"email": "alice@example.com"},
            headers={"kubeflow-userid": "alice@example.com", "x-mlcluster-jwt-payload": payload},
        )
        assert allowed(manifests, *workload, verified)


OWN_HTTP = [{"match": [{"uri": {"prefix": "/notebook/team-b/x/"}}], "route": OWN_DEST}]
MISPLACED_ROUTES: dict[str, dict[str, Any]] = {
    "no gateways (the mesh: every sidecar)": {"hosts": ["*"], "http": OWN_HTTP},
    "empty gateways": {"hosts": ["*"], "gateways": [], "http": OWN_HTTP},
    "gateways [mesh]": {"hosts": ["*"], "gateways": ["mesh"], "http": OWN_HTTP},
    "the gateway and mesh": {
        "hosts": ["*"],
        "gateways": ["istio-system/mlcluster-gateway", "mesh"],
        "http": OWN_HTTP,
    },
    "another namespace's gateway": {"hosts": ["*"], "gateways": ["team-a/gw"], "http": OWN_HTTP},
    "another gateway of istio-system": {
        "hosts": ["*"],
        "gateways": ["istio-system/other-gateway"],
        "http": OWN_HTTP,
    },
    "a host that is another namespace's Service": {
        "hosts": ["nb-alice.team-a.svc.cluster.local"],
        "gateways": ["istio-system/mlcluster-gateway"],
        "http": OWN_HTTP,
    },
    "the API server's host, tcp, on the mesh": {
        "hosts": ["kubernetes.default.svc.cluster.local"],
        "gateways": ["mesh"],
        "tcp": [{"match": [{"port": 443}], "route": OWN_DEST}],
    },
    "a tcp route to its own Service on the gateway": {
        "hosts": ["*"],
        "gateways": ["istio-system/mlcluster-gateway"],
        "tcp": [{"route": OWN_DEST}],
    },
    "a tls route on pypi.org's SNI": {
        "hosts": ["*"],
        "gateways": ["istio-system/mlcluster-gateway"],
        "tls": [{"match": [{"sniHosts": ["pypi.org"], "port": 443}], "route": OWN_DEST}],
    },
    "exported to every namespace": {
        "hosts": ["*"],
        "gateways": ["istio-system/mlcluster-gateway"],
        "exportTo": ["*"],
        "http": OWN_HTTP,
    },
    "exported to team-a": {
        "hosts": ["*"],
        "gateways": ["istio-system/mlcluster-gateway"],
        "exportTo": [".", "team-a"],
        "http": OWN_HTTP,
    },
    "no hosts": {"gateways": ["istio-system/mlcluster-gateway"], "http": OWN_HTTP},
}


@pytest.mark.parametrize("case", sorted(MISPLACED_ROUTES))
def test_attack_a_route_in_a_user_namespace_binds_only_to_the_printed_gateway(case: str) -> None:
    """Red team pass 2, G1: Bob's VirtualService with no gateways (or `mesh`) is applied by
    every sidecar in the mesh, so its hosts (Alice's Service, the API server's, pypi.org)
    and tcp/tls routes sent other tenants' traffic to his pod; another gateway escapes the
    printed one's rules. In a user namespace a route names exactly the printed gateway,
    only its host, is exported no further than its own namespace and the gateway's, and
    has http sections only. Bob's own route on the gateway, and the controller's, pass."""
    policy = _user_routes_policy()
    attack = {
        "apiVersion": "networking.istio.io/v1",
        "kind": "VirtualService",
        "metadata": {"name": "mine", "namespace": "team-b"},
        "spec": MISPLACED_ROUTES[case],
    }
    assert denials(policy, attack), f"a route with {case} was admitted"
    own = _vs("team-b", {"exportTo": [".", "istio-system"], "http": OWN_HTTP})
    assert denials(policy, own) == []
    notebook = objects.notebook_resource("nb1", "team-b", "bob@example.com")
    notebook["metadata"]["uid"] = "u1"
    assert denials(policy, objects.virtual_service(notebook, ControllerConfig(), "v1")) == []


def test_the_route_policy_takes_the_printed_gateway_and_host() -> None:
    """With `--gateway`/`--host`, the controller's routes (which use the same) pass and a
    route on the default gateway or another host does not."""
    manifests = all_manifests(gateway="kubeflow/kubeflow-gateway", host=HOST)
    [policy] = [
        m
        for m in manifests
        if m["kind"] == "ValidatingAdmissionPolicy"
        and m["metadata"]["name"] == "mlcluster-user-routes"
    ]
    config = ControllerConfig(gateway="kubeflow/kubeflow-gateway", host=HOST)
    notebook = objects.notebook_resource("nb1", "team-b", "bob@example.com")
    notebook["metadata"]["uid"] = "u1"
    assert denials(policy, objects.virtual_service(notebook, config, "v1")) == []
    assert denials(policy, _vs("team-b", {"http": OWN_HTTP}))  # hosts *, the default gateway
    with pytest.raises(ValueError, match="Gateway"):
        admission_objects(["sa"], gateway="istio-system/bad'name")
    with pytest.raises(ValueError, match="host"):
        admission_objects(["sa"], host="a' || true || '")


MESH_KINDS = {
    "Gateway": "gateways",
    "ServiceEntry": "serviceentries",
    "EnvoyFilter": "envoyfilters",
    "Sidecar": "sidecars",
    "WorkloadEntry": "workloadentries",
}


@pytest.mark.parametrize("kind", sorted(MESH_KINDS))
def test_attack_mesh_configuration_of_ones_own_is_refused_in_user_namespaces(kind: str) -> None:
    """Red team pass 2, G1: kubeflow-istio-edit lets a Profile's members create any
    networking.istio.io object: a Gateway selecting the shared ingress gateway's pods (with
    tls/tcp servers of their own), a ServiceEntry, an EnvoyFilter or a Sidecar reconfigure
    proxies beyond the namespace's pods. A policy bound to the user namespaces (both
    selectors) refuses each."""
    printed = admission_objects(["mlcluster-notebook"])
    [policy] = [
        m
        for m in printed
        if m["kind"] == "ValidatingAdmissionPolicy"
        and m["metadata"]["name"] == "mlcluster-user-mesh-config"
    ]
    obj = {
        "apiVersion": "networking.istio.io/v1",
        "kind": kind,
        "metadata": {"name": "x", "namespace": "team-b"},
        "spec": {"selector": {"istio": "ingressgateway"}},
    }
    assert denials(policy, obj)
    [rule] = policy["spec"]["matchConstraints"]["resourceRules"]
    assert MESH_KINDS[kind] in rule["resources"] and "CREATE" in rule["operations"]
    bindings = [
        m
        for m in printed
        if m["kind"] == "ValidatingAdmissionPolicyBinding"
        and m["spec"]["policyName"] == "mlcluster-user-mesh-config"
    ]
    selectors = [b["spec"]["matchResources"]["namespaceSelector"]["matchLabels"] for b in bindings]
    assert {USER_NAMESPACE_LABEL: "true"} in selectors
    assert dict(PROFILE_NAMESPACE_LABELS) in selectors
    assert validate_builtin_uncached(policy) == []
