"""A server shared through the trusted identity header serves JupyterLab's page and the
mlcluster API, and nothing else of Jupyter.

Such a server runs as one Unix user for everyone, and is bound in every user namespace. A
kernel or a terminal on it is code execution as the server; its contents API reads and
writes its files (everyone's); its settings and workspaces are shared by all its users. So
with `MLClusterApp.trust_identity_header` two gates stand in front of Jupyter:

- `SharedServerAuthorizer`, the Jupyter Server Authorizer: every handler that asks an
  Authorizer (`@authorized`: kernels, terminals, contents, sessions, kernelspecs, events,
  nbconvert, config, lsp, shutdown, ...) is refused, except the mlcluster API and reads that
  the lab page makes (kernelspecs, the caller's identity, config sections).
- `ConfinedRoutes`, a routing rule ahead of all others, for handlers that never ask an
  Authorizer (JupyterLab's own settings and workspaces API, other extensions' routes): a
  request is served only if its method and path are on `SERVED` (what the lab page needs to
  show the sidebar), else answered 403 before any handler runs.
- `_TokenInQuery`, ahead of that: a request with a token in its query string (`access_token`,
  Istio's and OAuth's, or `token`, Jupyter's) is answered 400 before any handler runs. A URL
  is not a place for a credential (access logs, history, Referer), and the gateway takes
  tokens only from the Authorization header, which it drops after verifying: one left in
  the URL would reach this server, and its logs, as it was.

Users run kernels and terminals in their own notebook servers (the Notebooks the sidebar
spawns), which are theirs alone.
"""

from __future__ import annotations

import json
import re
from typing import Any

from jupyter_server.auth.authorizer import Authorizer
from tornado import httputil, web
from tornado.routing import Matcher, Rule
from traitlets import Instance

# (methods, path under the base URL) a request on a shared server may have. Every write of
# Jupyter's own (settings, workspaces, contents, kernels, ...) is missing on purpose.
READ = frozenset({"GET", "HEAD"})
ANY = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
SERVED: tuple[tuple[frozenset[str], re.Pattern[str]], ...] = tuple(
    (methods, re.compile(pattern))
    for methods, pattern in [
        # The mlcluster API, its /events websocket and the TensorBoard proxy (each route
        # scoped to the caller; the proxy serves only the caller's own TensorBoards).
        (ANY, r"mlcluster(/.*)?"),
        # The lab page, its assets, and the reads it makes to draw itself: settings, themes,
        # translations, listings, licenses, workspaces (reads only: on a shared server they
        # are everyone's, so nobody may write them).
        (READ, r"lab(/.*)?"),
        (READ, r"static/.*"),
        (READ, r"custom/.*"),
        (READ, r"favicon\.ico"),
        # Who the caller is, and kernel specs (the launcher's icons): reads with no state.
        (READ, r"api/me"),
        (READ, r"api/kernelspecs(/.*)?"),
        (READ, r"kernelspecs/.*"),
        (READ, r"api/config/[^/]+"),
        # Prometheus: the extension's series carry no user's job names or ids here.
        (READ, r"metrics"),
    ]
)

# Resources of `@authorized` handlers a request may use, and how.
AUTHORIZED: dict[str, frozenset[str]] = {
    "mlcluster": frozenset({"read", "write", "execute"}),
    "kernelspecs": frozenset({"read"}),
    "api": frozenset({"read"}),
    "config": frozenset({"read"}),
}

REFUSAL = (
    "this Jupyter server is shared by many users (MLClusterApp.trust_identity_header): it "
    "serves JupyterLab's page and the mlcluster API only; kernels, terminals and files are "
    "in your own notebook server (the sidebar's Notebook servers)"
)


def served(method: str, path: str) -> bool:
    """May a request with this method reach this path (below the server's base URL)?"""
    return any(method in methods and pattern.fullmatch(path) for methods, pattern in SERVED)


class SharedServerAuthorizer(Authorizer):
    """Jupyter's Authorizer on a shared server: the mlcluster API and the lab page's reads,
    then whatever the server's own Authorizer says; every other resource is refused."""

    inner = Instance(Authorizer, help="The Authorizer the server had (it decides the rest).")

    def is_authorized(self, handler: Any, user: Any, action: str, resource: str) -> Any:
        if action not in AUTHORIZED.get(resource, ()):
            self.log.warning(
                "mlcluster: refused %s on %s (%s %s) on a shared server",
                action,
                resource,
                handler.request.method,
                handler.request.path,
            )
            return False
        return self.inner.is_authorized(handler, user, action, resource)


class _Refused(Matcher):
    """Matches the requests a shared server does not serve."""

    def __init__(self, base_url: str):
        self.base_url = "/" + base_url.strip("/") + "/" if base_url.strip("/") else "/"

    def match(self, request: httputil.HTTPServerRequest) -> dict[str, Any] | None:
        path = request.path or "/"
        if path + "/" == self.base_url:
            path = ""  # the base URL itself: redirects to the lab page, which is served
        elif path.startswith(self.base_url):
            path = path[len(self.base_url) :]
        else:
            return {}  # outside the server's base URL: nothing of ours
        if path == "" and request.method in READ:
            return None
        return None if served(request.method or "", path) else {}


# Query parameters that carry a bearer token (Istio's and RFC 6750's, Jupyter's own).
TOKEN_PARAMETERS = ("access_token", "token")
TOKEN_REFUSAL = (
    "a token in the URL's query string (access_token, token) is refused: send it in the "
    "Authorization header, which the gateway verifies and drops; a URL ends up in logs, "
    "browser history and Referer headers"
)


class _TokenInQuery(Matcher):
    """Matches the requests that carry a token in their query string."""

    def match(self, request: httputil.HTTPServerRequest) -> dict[str, Any] | None:
        arguments = httputil.parse_qs_bytes(request.query or "", keep_blank_values=True)
        return {} if any(name in arguments for name in TOKEN_PARAMETERS) else None


class TokenInQueryHandler(web.RequestHandler):
    """400 for every method (a websocket upgrade too), saying why."""

    def prepare(self) -> None:
        raise web.HTTPError(400)

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps({"message": TOKEN_REFUSAL, "reason": None}))

    def check_xsrf_cookie(self) -> None:
        """Refused before any XSRF question arises."""


class RefusedHandler(web.RequestHandler):
    """403 for every method (a websocket upgrade too), saying why."""

    def prepare(self) -> None:
        raise web.HTTPError(403)

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps({"message": REFUSAL, "reason": None}))

    def check_xsrf_cookie(self) -> None:
        """Refused before any XSRF question arises."""


def confine(web_app: web.Application, base_url: str) -> None:
    """Put the shared server's gates in front of `web_app`'s handlers (see the module)."""
    settings = web_app.settings
    inner = settings["authorizer"]
    settings["authorizer"] = SharedServerAuthorizer(
        inner=inner, parent=inner.parent, identity_provider=inner.identity_provider
    )
    router = web_app.default_router
    router.rules.insert(0, router.process_rule(Rule(_Refused(base_url), RefusedHandler)))
    router.rules.insert(0, router.process_rule(Rule(_TokenInQuery(), TokenInQueryHandler)))
