"""The authenticated way in: Gateway, JWT verification and the policy that requires it (pure).

Notebook AuthorizationPolicies admit a request when the identity header carries the owner's
name and the request comes from the ingress gateway. That is only safe when the gateway itself
writes that header from something a client cannot forge. Here it is a JWT of the platform's
OIDC issuer (oauth2-proxy/dex, Keycloak, a cloud IdP):

- `RequestAuthentication` on the ingress gateway workload verifies the token (issuer, JWKS,
  audiences) and copies the user claim into the identity header (`outputClaimToHeaders`,
  which sets the header, replacing any value the client sent), takes the token from the
  Authorization header only (never `?access_token=`, which would stay in the URL), drops the
  raw token (no route on the platform's shared gateway receives a visitor's bearer token)
  and passes on the verified payload in `PAYLOAD_HEADER` for the shared server, which checks
  its claims again (and refuses a token left in a query string: server/confinement.py);
- an `AuthorizationPolicy` (DENY) on the same workload refuses, for the notebook paths and the
  shared Jupyter server's prefix (`SERVER_PATHS`), every request without a verified request
  principal, and every token that lacks the user claim (so the header is always the one the
  gateway wrote, never the client's). The gateway workload is shared with the platform's other
  routes, so the policy names our paths rather than every path, except for one thing: a
  request that carries the identity or payload header without a verified principal is refused
  on every path, since a route on any path may lead to a workload that believes them.

Without an issuer there is nothing to verify identities with, so no Gateway is produced at all
(`mlcluster manifests` says why): an open Gateway would let anyone claim to be anyone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

# The paths the notebook routes live under (VirtualService prefixes /notebook/<ns>/<name>/).
NOTEBOOK_PATHS = ["/notebook/*", "/notebook"]
# The shared Jupyter server's base URL (ServerApp.base_url) behind the same gateway
# (server_deploy.py routes it); it trusts the identity header too, so it needs the same JWT.
SERVER_PREFIX = "/jupyter"
SERVER_PATHS = [f"{SERVER_PREFIX}/*", SERVER_PREFIX]
PROTECTED_PATHS = [*NOTEBOOK_PATHS, *SERVER_PATHS]
GATEWAY_SELECTOR = {"istio": "ingressgateway"}
# Where the gateway passes on the payload of the JWT it verified (Istio's outputPayloadToHeader)
# for the shared server, which checks its claims again (server/jwt_identity.py). The raw token
# is never forwarded: the gateway workload is the platform's, shared by every route on it, and
# `forwardOriginalToken` would hand each visitor's bearer token to all of them (users' own
# backends included) to replay. The payload carries no signature, so it is no credential.
PAYLOAD_HEADER = "x-mlcluster-jwt-payload"
# The ingress gateway's mTLS identity: the only caller the identity header is believed from.
GATEWAY_PRINCIPAL = "cluster.local/ns/istio-system/sa/istio-ingressgateway-service-account"


@dataclass(frozen=True)
class IngressAuth:
    """The platform's OIDC issuer and how its tokens name a user."""

    issuer: str
    jwks_uri: str = ""  # empty: Istio discovers it from the issuer's OpenID configuration
    audiences: Sequence[str] = field(default_factory=tuple)
    user_claim: str = "email"
    owner_header: str = "kubeflow-userid"

    def __post_init__(self) -> None:
        # An issuer signs tokens for every application it serves: without an audience, a
        # token minted for any of them (a dashboard, a CI bot) would pass the gateway here.
        if not [a for a in self.audiences if a]:
            raise ValueError(
                f"the OIDC issuer {self.issuer!r} needs the audiences of this application's "
                "tokens ('aud'): without them a token minted for any other application of the "
                "issuer would be accepted"
            )


def _split(gateway: str) -> tuple[str, str]:
    namespace, _, name = gateway.rpartition("/")
    return namespace or "istio-system", name


def gateway_hosts(host: str, route_namespaces: Sequence[str] = ()) -> list[str]:
    """The Gateway's `servers[].hosts`: `<namespace>/<host>` for each namespace whose
    VirtualServices may bind to it (Istio binds a route only where one matches), or the bare
    host (any namespace) when none is given."""
    if not route_namespaces:
        return [host]
    return [f"{namespace}/{host}" for namespace in dict.fromkeys(route_namespaces)]


def gateway(
    gateway: str, host: str, tls_secret: str = "", route_namespaces: Sequence[str] = ()
) -> dict[str, Any]:
    """The Gateway of the notebook routes: HTTPS with `tls_secret` (HTTP redirects to it);
    plain HTTP only when no certificate is given (behind a TLS-terminating load balancer).

    Only VirtualServices of `route_namespaces` bind to it (the shared server's namespace, the
    user namespaces whose notebooks the controller routes): a route is where a request's
    headers are last written, after the JWT filter, so a VirtualService of any other
    namespace could `headers.request.set` the identity header (or the payload header) to
    anyone and send the request to a notebook or the shared server, both of which believe
    what comes from the gateway."""
    namespace, name = _split(gateway)
    hosts = gateway_hosts(host, route_namespaces)
    if tls_secret:
        servers = [
            {
                "port": {"number": 443, "name": "https", "protocol": "HTTPS"},
                "hosts": list(hosts),
                "tls": {"mode": "SIMPLE", "credentialName": tls_secret},
            },
            {
                "port": {"number": 80, "name": "http", "protocol": "HTTP"},
                "hosts": list(hosts),
                "tls": {"httpsRedirect": True},
            },
        ]
    else:
        servers = [
            {"port": {"number": 80, "name": "http", "protocol": "HTTP"}, "hosts": list(hosts)}
        ]
    return {
        "apiVersion": "networking.istio.io/v1",
        "kind": "Gateway",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"selector": dict(GATEWAY_SELECTOR), "servers": servers},
    }


def request_authentication(gateway_name: str, auth: IngressAuth) -> dict[str, Any]:
    namespace, name = _split(gateway_name)
    rule: dict[str, Any] = {
        "issuer": auth.issuer,
        # Tokens from the Authorization header only, which the gateway drops once verified.
        # Istio's default also takes `?access_token=`: a token in the URL would stay there,
        # for every route behind the gateway (and its access logs) to read and replay.
        "fromHeaders": [{"name": "Authorization", "prefix": "Bearer "}],
        "outputClaimToHeaders": [{"header": auth.owner_header, "claim": auth.user_claim}],
        "outputPayloadToHeader": PAYLOAD_HEADER,
        "forwardOriginalToken": False,
    }
    if auth.jwks_uri:
        rule["jwksUri"] = auth.jwks_uri
    rule["audiences"] = list(auth.audiences)  # mandatory (IngressAuth)
    return {
        "apiVersion": "security.istio.io/v1",
        "kind": "RequestAuthentication",
        "metadata": {"name": f"{name}-jwt", "namespace": namespace},
        "spec": {"selector": {"matchLabels": dict(GATEWAY_SELECTOR)}, "jwtRules": [rule]},
    }


def require_identity_policy(
    gateway_name: str, auth: IngressAuth, paths: Sequence[str] = tuple(PROTECTED_PATHS)
) -> dict[str, Any]:
    """DENY, on the notebook paths and the shared server's: no verified principal, or a token
    without the user claim; on every path: the identity or payload header without a verified
    principal.

    A RequestAuthentication alone lets requests without any token through (it only rejects
    invalid ones); this policy is what makes a token mandatory."""
    namespace, name = _split(gateway_name)
    to = [{"operation": {"paths": list(paths)}}]
    return {
        "apiVersion": "security.istio.io/v1",
        "kind": "AuthorizationPolicy",
        "metadata": {"name": f"{name}-require-jwt", "namespace": namespace},
        "spec": {
            "selector": {"matchLabels": dict(GATEWAY_SELECTOR)},
            "action": "DENY",
            "rules": [
                {"from": [{"source": {"notRequestPrincipals": ["*"]}}], "to": to},
                {
                    "to": to,
                    "when": [
                        {"key": f"request.auth.claims[{auth.user_claim}]", "notValues": ["*"]}
                    ],
                },
                # On every path: a route elsewhere (a user's VirtualService rewriting its own
                # prefix to /jupyter/) would otherwise carry a client's own copies, which the
                # JWT filter writes over only when a token was verified.
                *(
                    {
                        "from": [{"source": {"notRequestPrincipals": ["*"]}}],
                        "when": [{"key": f"request.headers[{header}]", "values": ["*"]}],
                    }
                    for header in (auth.owner_header.lower(), PAYLOAD_HEADER)
                ),
            ],
        },
    }


def ingress_objects(
    gateway_name: str,
    host: str,
    auth: IngressAuth,
    tls_secret: str = "",
    route_namespaces: Sequence[str] = (),
) -> list[dict[str, Any]]:
    """Gateway (binding routes of `route_namespaces` only) + RequestAuthentication + the
    policy that requires a verified identity."""
    return [
        gateway(gateway_name, host, tls_secret, route_namespaces),
        request_authentication(gateway_name, auth),
        require_identity_policy(gateway_name, auth),
    ]
