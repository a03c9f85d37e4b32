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


def route_checks(identity_headers: Sequence[str]) -> list[tuple[str, str]]:
    """(CEL over a VirtualService `object` that must hold, message)."""
    for name in identity_headers:
        if not _HEADER_NAME.fullmatch(name):
            raise ValueError(f"{name!r} is not a header name this check takes")
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
        )
    ]
