"""Who is calling: the owner of the notebook servers a request may see and change.

By default the Jupyter Server identity provider's user name. Behind an authenticating proxy
(Kubeflow's way: Istio + oauth2-proxy/dex set `kubeflow-userid`), the proxy's identity header
instead, and only when the server is configured to trust it: anyone who can reach the server
without the proxy could set that header to anything.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class IdentityError(Exception):
    """The request carries no identity this server accepts (a 403 for the caller)."""


def calling_user(
    current_user: Any,
    headers: Mapping[str, str],
    *,
    trust_header: bool,
    header: str,
    prefix: str = "",
    verifier: Any = None,
) -> str:
    """The caller's identity as a Notebook's `spec.owner` holds it (the proxy's prefix removed:
    the controller's AuthorizationPolicy puts it back to compare with the header). With a
    `verifier` (jwt_identity.JwtVerifier), the identity is its verified token's, never the
    header's alone."""
    if not trust_header:
        name = getattr(current_user, "username", None) or getattr(current_user, "name", None)
        return str(name or current_user)
    if verifier is not None:
        return str(verifier.identity(headers, header, prefix))
    value = (headers.get(header) or "").strip()
    if prefix:
        if value and not value.startswith(prefix):
            raise IdentityError(
                f"the {header!r} header does not start with the configured prefix {prefix!r} "
                "(MLClusterApp.identity_header_prefix)"
            )
        value = value[len(prefix) :]
    if not value:
        raise IdentityError(
            f"this server takes the caller's identity from the {header!r} header that its "
            "authenticating proxy sets (MLClusterApp.trust_identity_header), and the request "
            "has none"
        )
    return value
