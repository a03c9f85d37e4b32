"""A shared server that verifies the gateway's JWT itself (`MLClusterApp.jwt_issuer`): a header
alone never names a caller (issue 22). Each test plays Mallory against a real Jupyter server
whose verifier reads the issuer's keys (JWKS) from a real HTTP server, with real RSA keys.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import http.server
import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

ISSUER = "https://dex.example.com"
AUDIENCE = "mlcluster"
ALICE, MALLORY = "alice@example.com", "mallory@example.com"


def _rsa() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


ISSUER_KEY = _rsa()
MALLORY_KEY = _rsa()  # Mallory's own key pair, published nowhere


def _jwks() -> dict[str, Any]:
    jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(ISSUER_KEY.public_key()))
    return {"keys": [{**jwk, "kid": "k1", "alg": "RS256", "use": "sig"}]}


@pytest.fixture
def jwks_url() -> Iterator[str]:
    """The issuer's keys, served over HTTP as an IdP serves them."""
    document = json.dumps(_jwks()).encode()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # the stdlib's name
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(document)))
            self.end_headers()
            self.wfile.write(document)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/keys"
    server.shutdown()
    server.server_close()
    thread.join(5)


@pytest.fixture
def server(tmp_path: Any, store_dir: Any, jwks_url: str) -> Iterator[Any]:
    """A real `jupyter server` as the printed Deployment runs it: trusted header, Jupyter's own
    token off (the gateway's JWT is the login, so Authorization carries the JWT and every
    refusal below is the verifier's), the issuer's keys at `jwks_url`."""
    from tests.server.live import LiveServer

    extra = [
        "--IdentityProvider.token=",
        "--MLClusterApp.trust_identity_header=True",
        f"--MLClusterApp.jwt_issuer={ISSUER}",
        f"--MLClusterApp.jwt_jwks_uri={jwks_url}",
        f"--MLClusterApp.jwt_audiences={AUDIENCE}",
        "--MLClusterApp.schedule_interval=0",
    ]
    made = LiveServer(tmp_path / "home", store_dir, extra).start(ready_path="api/me")
    yield made
    made.stop()


def _get_jobs(server: Any, headers: dict[str, str]) -> tuple[int, Any]:
    request = urllib.request.Request(f"{server.url}/mlcluster/api/jobs", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"null")


def _claims(**overrides: Any) -> dict[str, Any]:
    now = int(time.time())
    return {
        "iss": ISSUER,
        "aud": AUDIENCE,
        "sub": "u1",
        "email": ALICE,
        "email_verified": True,
        "iat": now,
        "exp": now + 600,
        **overrides,
    }


def _token(claims: dict[str, Any], key: Any = ISSUER_KEY, kid: str = "k1") -> str:
    return jwt.encode(claims, key, algorithm="RS256", headers={"kid": kid})


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _hs256_with_the_public_key(claims: dict[str, Any]) -> str:
    """The algorithm-confusion forgery: HMAC keyed with the issuer's public key (PEM)."""
    pem = ISSUER_KEY.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    head = _b64(json.dumps({"alg": "HS256", "typ": "JWT", "kid": "k1"}).encode())
    body = _b64(json.dumps(claims).encode())
    mac = hmac.new(pem, f"{head}.{body}".encode(), hashlib.sha256).digest()
    return f"{head}.{body}.{_b64(mac)}"


def _unsigned(claims: dict[str, Any]) -> str:
    head = _b64(json.dumps({"alg": "none", "typ": "JWT", "kid": "k1"}).encode())
    return f"{head}.{_b64(json.dumps(claims).encode())}."


def test_attack_header_alone_or_forged_tokens_do_not_name_a_caller(server: Any) -> None:
    """Mallory reaches the shared server around the gateway and sends `kubeflow-userid:
    alice`, alone or with a token she made: signed with her own key, unsigned (`alg: none`),
    HMAC-signed with the issuer's public key, expired, for another audience or issuer, or
    Alice's header with Mallory's genuine token. Each is refused (403) before any route
    runs; Alice's genuine token is accepted, with or without the header the gateway writes."""
    header = {"kubeflow-userid": ALICE}

    def bearer(token: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {token}", **header}

    genuine = bearer(_token(_claims()))
    # The keys are read in the verifier's own thread: wait until it knows them.
    deadline = time.monotonic() + 30
    while _get_jobs(server, genuine)[0] != 200:
        assert time.monotonic() < deadline, _get_jobs(server, genuine)
        time.sleep(0.2)
    refused = {
        "header alone": header,
        "Mallory's own key": bearer(_token(_claims(), key=MALLORY_KEY)),
        "Mallory's own key, a kid not published": bearer(
            _token(_claims(), key=MALLORY_KEY, kid="k2")
        ),
        "alg none": bearer(_unsigned(_claims())),
        "HS256 keyed with the public key": bearer(_hs256_with_the_public_key(_claims())),
        "expired": bearer(_token(_claims(exp=int(time.time()) - 3600))),
        "another audience": bearer(_token(_claims(aud="grafana"))),
        # Red team: a token the issuer minted for any application, with no audience at all.
        "no audience": bearer(_token({k: v for k, v in _claims().items() if k != "aud"})),
        # Red team: an address the IdP never verified (self-service sign-up as Alice).
        "email not verified": bearer(_token(_claims(email_verified=False))),
        "email_verified missing": bearer(
            _token({k: v for k, v in _claims().items() if k != "email_verified"})
        ),
        "email_verified as a string": bearer(_token(_claims(email_verified="true"))),
        "another issuer": bearer(_token(_claims(iss="https://evil.example.com"))),
        "no user claim": bearer(_token({k: v for k, v in _claims().items() if k != "email"})),
        "Mallory's genuine token, Alice's header": bearer(_token(_claims(email=MALLORY))),
        "not a JWT": bearer("alice"),
    }
    for attack, headers in refused.items():
        status, reply = _get_jobs(server, headers)
        assert status == 403, (attack, status, reply)
        message = reply["message"]
        assert "token" in message or "header names someone" in message, (attack, message)
    assert "not verified" in _get_jobs(server, refused["email not verified"])[1]["message"]
    assert _get_jobs(server, genuine)[0] == 200
    assert _get_jobs(server, {"Authorization": f"Bearer {_token(_claims())}"})[0] == 200


def test_a_server_with_an_issuer_and_no_audience_refuses_to_start(
    tmp_path: Any, store_dir: Any, jwks_url: str
) -> None:
    """Red team: with no audience configured, a token the issuer minted for any other of its
    applications logged in. An issuer without `jwt_audiences` is now a configuration error
    that stops the server (not a logged extension failure after which Jupyter would serve on
    with its own token off), and the verifier itself refuses to be made without one."""
    from jupyterlab_mlcluster.server.jwt_identity import JwtVerifier
    from tests.server.live import LiveServer

    with pytest.raises(ValueError, match="needs its audiences"):
        JwtVerifier(ISSUER, jwks_uri=jwks_url)
    with pytest.raises(ValueError, match="needs its audiences"):
        JwtVerifier(ISSUER, jwks_uri=jwks_url, audiences=[""])
    extra = [
        "--IdentityProvider.token=",
        "--MLClusterApp.trust_identity_header=True",
        f"--MLClusterApp.jwt_issuer={ISSUER}",
        f"--MLClusterApp.jwt_jwks_uri={jwks_url}",
        "--MLClusterApp.schedule_interval=0",
    ]
    live = LiveServer(tmp_path / "home", store_dir, extra)
    try:
        with pytest.raises(AssertionError, match="jupyter server exited") as failed:
            live.start(ready_path="api/me")
    finally:
        live.stop()
    assert "needs MLClusterApp.jwt_audiences" in str(failed.value)


PAYLOAD_HEADER = "x-mlcluster-jwt-payload"


def test_attack_behind_the_gateway_the_payload_is_checked_like_a_token(
    tmp_path: Any, store_dir: Any, jwks_url: str
) -> None:
    """The printed gateway drops the raw token (no other route may receive it) and passes on
    the verified payload (Istio's outputPayloadToHeader, base64url JSON). The server, told so
    (`jwt_payload_header`), takes the caller from it and checks its claims as a token's: a
    payload for another audience or issuer, expired, without `exp`, with an unverified email,
    naming someone other than the identity header, or not a payload at all is refused; the
    header alone still names nobody. A bearer token, when one comes, is verified in full."""
    from tests.server.live import LiveServer

    extra = [
        "--IdentityProvider.token=",
        "--MLClusterApp.trust_identity_header=True",
        f"--MLClusterApp.jwt_issuer={ISSUER}",
        f"--MLClusterApp.jwt_jwks_uri={jwks_url}",
        f"--MLClusterApp.jwt_audiences={AUDIENCE}",
        f"--MLClusterApp.jwt_payload_header={PAYLOAD_HEADER}",
        "--MLClusterApp.schedule_interval=0",
    ]
    server = LiveServer(tmp_path / "home", store_dir, extra).start(ready_path="api/me")
    try:
        header = {"kubeflow-userid": ALICE}

        def payload(claims: Any) -> dict[str, str]:
            return {PAYLOAD_HEADER: _b64(json.dumps(claims).encode()), **header}

        status, reply = _get_jobs(server, payload(_claims()))
        assert status == 200, reply
        assert _get_jobs(server, payload(_claims(aud=["other", AUDIENCE])))[0] == 200
        refused = {
            "header alone": header,
            "another audience": payload(_claims(aud="grafana")),
            "no audience": payload({k: v for k, v in _claims().items() if k != "aud"}),
            "another issuer": payload(_claims(iss="https://evil.example.com")),
            "expired": payload(_claims(exp=int(time.time()) - 3600)),
            "no exp": payload({k: v for k, v in _claims().items() if k != "exp"}),
            "not yet valid": payload(_claims(nbf=int(time.time()) + 3600)),
            "email not verified": payload(_claims(email_verified=False)),
            "Mallory's payload, Alice's header": payload(_claims(email=MALLORY)),
            "not base64 JSON": {PAYLOAD_HEADER: "%%%", **header},
            "a JSON list": {PAYLOAD_HEADER: _b64(b"[1]"), **header},
            # A bearer token is verified in full, payload header or not.
            "a forged bearer token beside a good payload": {
                "Authorization": f"Bearer {_token(_claims(), key=MALLORY_KEY)}",
                **payload(_claims()),
            },
        }
        for attack, headers in refused.items():
            status, reply = _get_jobs(server, headers)
            assert status == 403, (attack, status, reply)
    finally:
        server.stop()
