"""The caller's identity from a verified JWT, not from a header alone (a shared server).

Behind the printed layout (notebook_controller/server_deploy.py) only the ingress gateway
reaches the server, and it writes the identity header from a token it verified. This is the
second lock, for when something else reaches the server after all (a mesh without the policy,
a port-forward, a misrouted Service): with `MLClusterApp.jwt_issuer` set, a request names its
caller only with a token of that issuer (`Authorization: Bearer`, which the gateway forwards),
checked here: signature against the issuer's published keys (JWKS), `iss`, `aud` (mandatory:
an issuer signs tokens for all its applications, and a token minted for another of them must
not log in here), `exp`/`nbf`; asymmetric algorithms only (never `none` or an HMAC whose
"secret" would be the public key). The user is the token's `user_claim`; when that is `email`,
the token must also say `email_verified: true` (an IdP that lets anyone register an address
would otherwise let Mallory sign up as alice@...). An identity header that names someone else
is refused.

Behind the printed gateway the raw token does not come at all: the gateway verifies it and
drops it (a raw token forwarded from the platform-wide gateway would reach every route on it,
users' own backends included, to be replayed), and passes on the verified payload in
`payload_header` instead (Istio's `outputPayloadToHeader`). A request with that header and no
bearer token is judged by its claims (`iss`, `aud`, `exp`/`nbf`, the user claim,
`email_verified`), not by a signature: the payload carries none, so it is believed only because
nothing but the gateway reaches the server (its ALLOW policy and STRICT mTLS). A bearer token,
where one comes, is still verified in full.

Keys are fetched off the event loop: a daemon thread reads the JWKS at start and every
`refresh_interval` seconds, and sooner (at most every `MIN_REFRESH` seconds) when a token names
a key it does not know (the issuer rotated its keys). Verifying is CPU only.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import threading
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jwt

from .identity import IdentityError

log = logging.getLogger("jupyterlab_mlcluster.jwt")

# Asymmetric only: with an HMAC algorithm allowed, a public key could be used as its secret.
ALGORITHMS = ["RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512"]
MAX_DOCUMENT = 1024 * 1024  # a JWKS or OpenID configuration is a few KiB
MIN_REFRESH = 30.0
FETCH_TIMEOUT = 10.0


def fetch_json(url: str) -> Any:
    """GET a JSON document (blocking; at most MAX_DOCUMENT bytes)."""
    request = urllib.request.Request(url, headers={"Accept": "application/json"})
    with urllib.request.urlopen(request, timeout=FETCH_TIMEOUT) as response:
        body = response.read(MAX_DOCUMENT + 1)
    if len(body) > MAX_DOCUMENT:
        raise ValueError(f"{url} answered more than {MAX_DOCUMENT} bytes")
    return json.loads(body)


class JwtVerifier:
    def __init__(
        self,
        issuer: str,
        *,
        jwks_uri: str = "",
        audiences: Sequence[str] = (),
        user_claim: str = "email",
        payload_header: str = "",
        leeway: float = 30.0,
        refresh_interval: float = 300.0,
        fetch: Callable[[str], Any] = fetch_json,
    ):
        if not issuer:
            raise ValueError("a JWT verifier needs the issuer")
        if not [a for a in audiences if a]:
            raise ValueError(
                f"a JWT verifier for {issuer!r} needs its audiences (MLClusterApp.jwt_audiences:"
                " the 'aud' your IdP puts in this application's tokens): without them a token "
                "the issuer minted for any other application would be accepted"
            )
        self.issuer = issuer
        self.jwks_uri = jwks_uri
        self.audiences = list(audiences)
        self.user_claim = user_claim
        self.payload_header = payload_header
        self.leeway = leeway
        self.refresh_interval = refresh_interval
        self._fetch = fetch
        self._keys: dict[str, Any] = {}  # kid -> PyJWK
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_refresh = -float("inf")
        self.loaded = threading.Event()  # set once keys were read (tests, readiness)

    # -- keys (blocking; the refresh thread) ------------------------------------------------
    def _keys_url(self) -> str:
        if self.jwks_uri:
            return self.jwks_uri
        config = self._fetch(self.issuer.rstrip("/") + "/.well-known/openid-configuration")
        return str(config["jwks_uri"])

    def refresh(self) -> None:
        """Read the issuer's keys now (blocking). Keeps the old ones if that fails."""
        self._last_refresh = time.monotonic()
        try:
            document = self._fetch(self._keys_url())
            found = jwt.PyJWKSet.from_dict(document)
        except Exception as exc:  # noqa: BLE001 - an unreachable issuer must not take the server down
            log.warning("mlcluster: could not read the JWT issuer's keys: %r", exc)
            return
        keys = {
            key.key_id: key
            for key in found.keys
            if key.key_id and (key.algorithm_name in ALGORITHMS or not key.algorithm_name)
        }
        with self._lock:
            self._keys = keys
        self.loaded.set()

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="mlcluster-jwks", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(5)

    def _run(self) -> None:
        while not self._stopping.is_set():
            self.refresh()
            self._wake.wait(self.refresh_interval)
            self._wake.clear()
            # Asked early (an unknown key): not more often than MIN_REFRESH.
            wait = MIN_REFRESH - (time.monotonic() - self._last_refresh)
            if wait > 0 and not self._stopping.is_set():
                self._stopping.wait(wait)

    # -- verifying (CPU only: safe on the event loop) ---------------------------------------
    def claims(self, token: str) -> dict[str, Any]:
        try:
            kid = jwt.get_unverified_header(token).get("kid")
        except jwt.PyJWTError as exc:
            raise IdentityError(f"the bearer token is not a JWT: {exc}") from None
        with self._lock:
            key = self._keys.get(kid) if kid else None
            if key is None and kid is None and len(self._keys) == 1:
                key = next(iter(self._keys.values()))
        if key is None:
            self._wake.set()  # perhaps rotated: read the keys again, in the background
            raise IdentityError("the bearer token is signed with a key its issuer does not publish")
        try:
            return jwt.decode(
                token,
                key.key,
                algorithms=[key.algorithm_name] if key.algorithm_name else ALGORITHMS,
                issuer=self.issuer,
                audience=self.audiences,
                leeway=self.leeway,
                options={"require": ["exp", "iss", "aud"], "verify_aud": True},
            )
        except jwt.PyJWTError as exc:
            raise IdentityError(f"the bearer token was refused: {exc}") from None

    def gateway_claims(self, value: str) -> dict[str, Any]:
        """The claims of a payload the gateway verified (base64url JSON, Istio's
        `outputPayloadToHeader`), checked for issuer, audience and time as a token's are."""
        text = value.strip().replace("+", "-").replace("/", "_")
        try:
            claims = json.loads(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
        except (binascii.Error, ValueError) as exc:
            raise IdentityError(f"the gateway's JWT payload is not base64 JSON: {exc}") from None
        if not isinstance(claims, dict):
            raise IdentityError("the gateway's JWT payload is not a JSON object")
        if claims.get("iss") != self.issuer:
            raise IdentityError("the gateway's JWT payload was refused: another issuer")
        audience = claims.get("aud")
        audiences = [audience] if isinstance(audience, str) else audience
        if not isinstance(audiences, list) or not set(map(str, audiences)) & set(self.audiences):
            raise IdentityError("the gateway's JWT payload was refused: not for this audience")
        now = time.time()
        expires, not_before = claims.get("exp"), claims.get("nbf", 0)
        if not isinstance(expires, (int, float)) or expires + self.leeway < now:
            raise IdentityError("the gateway's JWT payload was refused: expired (or no exp)")
        if not isinstance(not_before, (int, float)) or not_before - self.leeway > now:
            raise IdentityError("the gateway's JWT payload was refused: not yet valid (nbf)")
        return claims

    def identity(self, headers: Mapping[str, str], header: str, prefix: str = "") -> str:
        """The caller named by the request's verified token (or, without one, the payload
        the gateway verified, in `payload_header`); IdentityError otherwise."""
        scheme, _, token = (headers.get("Authorization") or "").partition(" ")
        payload = (headers.get(self.payload_header) or "") if self.payload_header else ""
        if scheme.lower() == "bearer" and token.strip():
            claims = self.claims(token.strip())
        elif payload.strip():
            claims = self.gateway_claims(payload)
        else:
            raise IdentityError(
                "this server takes the caller's identity from a JWT of its issuer "
                "(MLClusterApp.jwt_issuer) and the request has no bearer token"
                + (
                    f" nor the gateway's verified payload ({self.payload_header})"
                    if self.payload_header
                    else ""
                )
            )
        user = claims.get(self.user_claim)
        if not isinstance(user, str) or not user:
            raise IdentityError(f"the bearer token has no {self.user_claim!r} claim")
        if self.user_claim == "email" and claims.get("email_verified") is not True:
            raise IdentityError(
                "the bearer token's email is not verified (email_verified is not true): an "
                "address nobody proved to own names nobody"
            )
        claimed = (headers.get(header) or "").strip()
        if claimed and claimed != prefix + user:
            raise IdentityError(
                f"the {header!r} header names someone other than the bearer token's user"
            )
        return user
