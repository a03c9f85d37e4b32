"""No route in a user namespace writes the headers that say who the caller is (pure).

Notebooks and the shared server believe the identity header (and the server the verified JWT
payload header) on requests from the ingress gateway. The gateway writes both from the token
it verified, but a VirtualService's `headers.request.set`/`add` is applied later, by the
route: a route of Mallory's could send a request, with `kubeflow-userid: alice`, to Alice's
notebook or to the shared server. The printed Gateway binds routes only from the platform's
namespaces and the user namespaces (ingress.gateway_hosts); in a user namespace, where
whoever may create VirtualServices (Kubeflow's `kubeflow-edit` grants it in Profile
namespaces) could make such a route, this check refuses any that sets or adds those headers,
at any level (the route's or one destination's). The controller's notebook routes set none.

Nor may such a route claim a path that is not its namespace's, or lead anywhere outside it
(red team of issue 31, F1 and F2): routes of every namespace bound to the Gateway share its
host, and Istio merges them oldest first, so a route of team-b on `/notebook/team-a/` (or a
regex, `/jupyter/lab`, a catch-all) would serve team-a's URLs on the shared origin, with
their cookies; and a route on `/bob-x/` rewritten to `/jupyter/` would lead to the shared
server on a path the gateway's token requirement does not name. Every http match of a route
in a user namespace is therefore a `uri` prefix (or exact path) under `/notebook/<its namespace>/`
(no regex, no match-less rule), a rewrite stays under it, there is no delegation, and every
destination and mirror is a Service of its own namespace (a short name, `<svc>.<ns>`,
`<svc>.<ns>.svc` or `<svc>.<ns>.svc.cluster.local`).

A route is also applied where its `gateways` say (red team pass 2, G1): none, or `mesh`, puts
it on every sidecar of the mesh (Istio exports a VirtualService to every namespace by
default), where its `hosts` (another namespace's Service, the API server's, `*`) and its
tcp/tls sections would take over other tenants' traffic to those hosts. So in a user namespace
`gateways` is exactly the printed Gateway, `hosts` only the Gateway's host, `exportTo`
(absent: everywhere, moot once no sidecar applies it) names no namespace but its own and the
Gateway's, and there are only http sections. Gateways, ServiceEntries, EnvoyFilters,
Sidecars, WorkloadEntries and WorkloadGroups of its own are refused outright
(`MESH_POLICY_NAME`): each reconfigures proxies beyond the namespace's own pods.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

ROUTES_POLICY_NAME = "mlcluster-user-routes"
ROUTE_RESOURCES = [
    {
        "apiGroups": ["networking.istio.io"],
        "apiVersions": ["*"],
        "resources": ["virtualservices"],
        "operations": ["CREATE", "UPDATE"],
    }
]
MESH_POLICY_NAME = "mlcluster-user-mesh-config"
MESH_RESOURCES = [
    {
        "apiGroups": ["networking.istio.io"],
        "apiVersions": ["*"],
        "resources": [
            "gateways",
            "serviceentries",
            "envoyfilters",
            "sidecars",
            "workloadentries",
            "workloadgroups",
        ],
        "operations": ["CREATE", "UPDATE"],
    }
]
MESH_CHECKS = [
    (
        "false",
        "Istio Gateways, ServiceEntries, EnvoyFilters, Sidecars, WorkloadEntries and "
        "WorkloadGroups are the platform's: none in a user namespace",
    )
]
# The header names this check accepts: plain ones, so that they go into the CEL regex as
# they are ('.' as '[.]').
_HEADER_NAME = re.compile(r"[A-Za-z0-9_.-]+")


def _no_header_written(where: str, pattern: str) -> str:
    request = f"{where}.headers.request"
    return (
        f"(!has({where}.headers) || !has({request}) || ("
        f"(!has({request}.set) || !{request}.set.exists(k, k.matches('{pattern}'))) && "
        f"(!has({request}.add) || !{request}.add.exists(k, k.matches('{pattern}')))))"
    )


# The notebooks' URL root (jupyterlab_mlcluster.notebook_resource.url_prefix); a user
# namespace's routes live under `/notebook/<namespace>/`.
NOTEBOOK_ROOT = "/notebook/"
_OWN = f"('{NOTEBOOK_ROOT}' + object.metadata.namespace + '/')"


def _own_path(value: str) -> str:
    return f"({value}.startsWith({_OWN}) && !{value}.contains('/..'))"


def _own_host(value: str) -> str:
    label = "[a-z0-9]([-a-z0-9]*[a-z0-9])?"
    return (
        f"{value}.matches('^{label}([.]' + object.metadata.namespace + "
        "'([.]svc([.]cluster[.]local)?)?)?$')"
    )


def _own_uri(m: str) -> str:
    uri = f"{m}.uri"
    return (
        f"(has({uri}) && !has({uri}.regex) && ("
        f"(has({uri}.prefix) && {_own_path(uri + '.prefix')}) || "
        f"(has({uri}.exact) && {_own_path(uri + '.exact')})))"
    )


def _own_destinations(routes: str) -> str:
    return f"(!has({routes}.route) || {routes}.route.all(r, {_own_host('r.destination.host')}))"


def _scope_checks() -> list[tuple[str, str]]:
    http = "object.spec.http"
    return [
        (
            f"!has(object.spec) || !has({http}) || {http}.all(h, "
            f"has(h.match) && size(h.match) > 0 && h.match.all(m, {_own_uri('m')}))",
            "a VirtualService in a user namespace matches only paths under "
            f"{NOTEBOOK_ROOT}<its namespace>/ (uri prefix or exact; no regex, no rule without "
            "a match): other paths are other users' or the shared server's",
        ),
        (
            f"!has(object.spec) || !has({http}) || {http}.all(h, !has(h.delegate) && "
            "(!has(h.rewrite) || (!has(h.rewrite.uriRegexRewrite) && "
            f"(!has(h.rewrite.uri) || {_own_path('h.rewrite.uri')}))))",
            "a VirtualService in a user namespace may not rewrite a path out of "
            f"{NOTEBOOK_ROOT}<its namespace>/ nor delegate",
        ),
        (
            "!has(object.spec) || ("
            f"(!has({http}) || {http}.all(h, {_own_destinations('h')} && "
            f"(!has(h.mirror) || {_own_host('h.mirror.host')}) && "
            f"(!has(h.mirrors) || h.mirrors.all(x, {_own_host('x.destination.host')})))) && "
            "(!has(object.spec.tcp) || object.spec.tcp.all(t, "
            f"{_own_destinations('t')})) && "
            f"(!has(object.spec.tls) || object.spec.tls.all(t, {_own_destinations('t')})))",
            "a VirtualService in a user namespace routes and mirrors only to Services of its "
            "own namespace",
        ),
    ]


def _placement_checks(gateway: str, host: str) -> list[tuple[str, str]]:
    gateway_namespace = gateway.rpartition("/")[0] or "istio-system"
    spec = "object.spec"
    return [
        (
            f"has({spec}) && has({spec}.gateways) && {spec}.gateways == ['{gateway}']",
            f"a VirtualService in a user namespace names exactly the gateway {gateway} "
            "(none, or mesh, would apply it to every sidecar in the mesh)",
        ),
        (
            f"has({spec}) && has({spec}.hosts) && size({spec}.hosts) > 0 && "
            f"{spec}.hosts.all(h, h == '{host}')",
            f"a VirtualService in a user namespace answers only on the gateway's host ({host})",
        ),
        (
            f"!has({spec}) || !has({spec}.exportTo) || "
            f"{spec}.exportTo.all(e, e in ['.', object.metadata.namespace, "
            f"'{gateway_namespace}'])",
            "a VirtualService in a user namespace is exported only to its own namespace and "
            f"the gateway's ({gateway_namespace})",
        ),
        (
            f"!has({spec}) || ((!has({spec}.tcp) || size({spec}.tcp) == 0) && "
            f"(!has({spec}.tls) || size({spec}.tls) == 0))",
            "a VirtualService in a user namespace has http routes only (no tcp, no tls)",
        ),
    ]


_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?")
_HOST = re.compile(r"\*|(\*\.)?[a-z0-9]([-a-z0-9.]*[a-z0-9])?")


def route_checks(
    identity_headers: Sequence[str],
    gateway: str = "istio-system/mlcluster-gateway",
    host: str = "*",
) -> list[tuple[str, str]]:
    """(CEL over a VirtualService `object` that must hold, message)."""
    for name in identity_headers:
        if not _HEADER_NAME.fullmatch(name):
            raise ValueError(f"{name!r} is not a header name this check takes")
    # Both are written into the CEL as they are.
    namespace, _, gateway_name = gateway.rpartition("/")
    if not ((not namespace or _NAME.fullmatch(namespace)) and _NAME.fullmatch(gateway_name)):
        raise ValueError(f"{gateway!r} is not <namespace>/<name> of a Gateway")
    if not _HOST.fullmatch(host):
        raise ValueError(f"{host!r} is not a host name")
    # Header names are case-insensitive.
    names = "|".join(n.replace(".", "[.]") for n in identity_headers)
    pattern = f"(?i)^({names})$"
    http = "object.spec.http"
    return [
        (
            f"!has(object.spec) || !has({http}) || {http}.all(h, "
            f"{_no_header_written('h', pattern)} && "
            f"(!has(h.route) || h.route.all(r, {_no_header_written('r', pattern)})))",
            "a VirtualService in a user namespace may not set or add the headers that say who "
            f"the caller is ({', '.join(identity_headers)}): only the gateway writes them",
        ),
        *_scope_checks(),
        *_placement_checks(gateway, host),
    ]
