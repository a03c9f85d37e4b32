"""A server shared through the trusted identity header (issue 22): Bob, identified by the
header, reaches JupyterLab's page and the mlcluster API, and nothing else of Jupyter. A
kernel, a terminal or a file written there would be code or data as the server, which runs as
one Unix user for everyone. A real Jupyter server (pytest-jupyter) with JupyterLab and the
terminals extension loaded, as a deployment has them.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from tornado.httpclient import HTTPClientError

from jupyterlab_mlcluster.server.confinement import REFUSAL, served

BOB = {"kubeflow-userid": "bob@example.com"}


@pytest.fixture
def mlc_config() -> dict[str, Any]:
    return {
        "ServerApp": {
            "jpserver_extensions": {
                "jupyterlab_mlcluster": True,
                "jupyterlab": True,
                "jupyter_server_terminals": True,
            },
            "terminals_enabled": True,
        },
        "MLClusterApp": {"trust_identity_header": True},
    }


async def fetch(jp_fetch, method: str, path: str, body: Any = None):
    response = await jp_fetch(
        *path.split("/"),
        method=method,
        body=None if body is None else json.dumps(body),
        headers=dict(BOB),
        raise_error=False,
        allow_nonstandard_methods=True,
        follow_redirects=False,
    )
    return response.code, response.body.decode(errors="replace")


# What an attacker with only the header would try: code as the server, its files, its shared
# settings and workspaces, other users' activity on the event bus.
REFUSED = [
    ("GET", "api/kernels", None),
    ("POST", "api/kernels", {"name": "python3"}),
    ("GET", "api/sessions", None),
    (
        "POST",
        "api/sessions",
        {"path": "x.ipynb", "type": "notebook", "kernel": {"name": "python3"}},
    ),
    ("GET", "api/terminals", None),
    ("POST", "api/terminals", {}),
    ("GET", "api/contents", None),
    ("GET", "api/contents/secret.txt", None),
    ("PUT", "api/contents/evil.py", {"type": "file", "format": "text", "content": "x"}),
    ("GET", "files/secret.txt", None),
    ("PUT", "lab/api/settings/@jupyterlab/apputils-extension:themes", {"raw": "{}"}),
    ("PUT", "lab/api/workspaces/lab", {"data": {}, "metadata": {"id": "lab"}}),
    ("DELETE", "lab/api/workspaces/lab", None),
    ("PATCH", "api/config/notebook", {"x": 1}),
    ("POST", "api/events", {"schema_id": "x", "version": "1", "data": {}}),
    ("GET", "api/nbconvert", None),
    ("POST", "api/shutdown", None),
    ("GET", "tree", None),
]


async def test_attack_header_user_gets_no_kernel_terminal_or_file(jp_fetch, mlc, jp_serverapp):
    from pathlib import Path

    root = Path(jp_serverapp.root_dir)
    (root / "secret.txt").write_text("everyone's")
    for method, path, body in REFUSED:
        status, text = await fetch(jp_fetch, method, path, body)
        assert status == 403, (method, path, status, text[:300])
        assert "everyone's" not in text
    assert jp_serverapp.kernel_manager.list_kernel_ids() == []
    assert not (root / "evil.py").exists()
    terminals = jp_serverapp.web_app.settings.get("terminal_manager")
    assert terminals is None or terminals.list() == []
    # The refusal says why and where to go instead.
    status, text = await fetch(jp_fetch, "POST", "api/kernels", {"name": "python3"})
    assert json.loads(text)["message"] == REFUSAL


async def test_attack_header_user_opens_no_kernel_terminal_or_event_websocket(jp_ws_fetch, mlc):
    for path in (
        "api/kernels/00000000-0000-0000-0000-000000000000/channels",
        "terminals/websocket/1",
        "api/events/subscribe",
    ):
        with pytest.raises(HTTPClientError) as refused:
            await jp_ws_fetch(*path.split("/"), headers=dict(BOB))
        assert getattr(refused.value, "code", None) == 403, (path, refused.value)


async def test_header_user_reaches_the_lab_page_and_the_mlcluster_api(jp_fetch, mlc):
    for path in (
        "lab",
        "lab/api/settings",
        "lab/api/translations",
        "api/me",
        "api/kernelspecs",
        "mlcluster/api/jobs",
        "mlcluster/api/cluster",
        "mlcluster/api/openapi.json",
    ):
        status, text = await fetch(jp_fetch, "GET", path)
        assert status == 200, (path, status, text[:300])
    # The mlcluster API's writes are served (and answer for themselves): a bad job is a 400.
    status, text = await fetch(jp_fetch, "POST", "mlcluster/api/jobs", {"workers": "many"})
    assert status == 400, text


async def test_attack_a_token_in_the_query_string_is_refused(jp_fetch, jp_ws_fetch, mlc):
    """Issue 31: a bearer token in the URL (`?access_token=`, Istio's and OAuth's query
    location, or Jupyter's `?token=`) would reach the server behind the gateway as it is,
    and its access logs with it. The gateway takes tokens from the header only
    (test_attack_a_token_in_the_query_string_is_no_credential_at_the_gateway); the server
    refuses a request that still carries one (400 saying why), on every route, websockets
    too, before any handler runs; the same requests without it are served."""
    from jupyterlab_mlcluster.server.confinement import TOKEN_REFUSAL

    for name in ("access_token", "token"):
        for method, path in [
            ("GET", "mlcluster/api/jobs"),
            ("POST", "mlcluster/api/jobs"),
            ("GET", "lab"),
            ("GET", "api/kernels"),
        ]:
            response = await jp_fetch(
                *path.split("/"),
                method=method,
                params={name: "eyJhbGciOiJSUzI1NiJ9.e30.c2ln"},
                body=None if method == "GET" else json.dumps({"code": "1"}),
                headers=dict(BOB),
                raise_error=False,
                follow_redirects=False,
            )
            assert response.code == 400, (name, path, response.code)
            assert json.loads(response.body)["message"] == TOKEN_REFUSAL
        with pytest.raises(HTTPClientError) as refused:
            await jp_ws_fetch("mlcluster", "api", "events", params={name: "x"}, headers=dict(BOB))
        assert getattr(refused.value, "code", None) == 400
    status, _ = await fetch(jp_fetch, "GET", "mlcluster/api/jobs")
    assert status == 200


def test_what_a_shared_server_serves():
    assert served("GET", "lab/tree/x.ipynb") and not served("PUT", "lab/api/workspaces/x")
    assert served("DELETE", "mlcluster/api/jobs/j1") and not served("GET", "mlcluster-evil")
    assert not served("GET", "api/kernels") and not served("GET", "lsp/ws/pyright")
    assert not served("GET", "api/contents") and served("GET", "static/lab/main.js")


def test_the_shared_servers_authorizer_refuses_every_other_resource(jp_serverapp, mlc):
    """Behind the route gate, Jupyter's Authorizer says the same to every `@authorized`
    handler: the mlcluster API, and reads the lab page makes, only."""
    from types import SimpleNamespace

    from jupyterlab_mlcluster.server.confinement import SharedServerAuthorizer

    authorizer = jp_serverapp.web_app.settings["authorizer"]
    assert isinstance(authorizer, SharedServerAuthorizer)
    handler = SimpleNamespace(request=SimpleNamespace(method="POST", path="/x"))
    user = SimpleNamespace(username="bob@example.com")
    for action, resource in [
        ("execute", "kernels"),
        ("read", "kernels"),
        ("execute", "terminals"),
        ("write", "contents"),
        ("read", "contents"),
        ("write", "sessions"),
        ("write", "kernelspecs"),
        ("read", "events"),
        ("write", "config"),
        ("read", "lsp"),
        ("write", "server"),
    ]:
        assert not authorizer.is_authorized(handler, user, action, resource), (action, resource)
    for action, resource in [("read", "mlcluster"), ("write", "mlcluster"), ("read", "api")]:
        assert authorizer.is_authorized(handler, user, action, resource), (action, resource)
