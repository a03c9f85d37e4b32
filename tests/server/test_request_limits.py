"""What one caller's request may cost the server (a valid identity is all it takes).

Jupyter reads request bodies of up to 512 MiB by default, whole, before a handler sees them,
and a schema error used to repeat the offending value: a 64 MiB string came back in the 400,
after several copies of it had been made. The mlcluster API judges a body by its
Content-Length before reading any of it (413, MLClusterApp.max_request_body), and a
validation message repeats at most a few hundred characters of the value.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from .test_attacks import Caller

BOB = "bob@example.com"


@pytest.fixture
def mlc_config() -> dict[str, Any]:
    return {"MLClusterApp": {"trust_identity_header": True, "schedule_interval": 0}}


async def raw_request(port: int, head: str, body: bytes, timeout: float = 30) -> bytes:
    """Send a request's head and only part of its body; what the server answers meanwhile."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(head.encode() + body)
        await writer.drain()
        return await asyncio.wait_for(reader.read(65536), timeout)
    finally:
        writer.close()


async def test_attack_oversized_body_is_refused_from_its_content_length(
    mlc, jp_fetch, jp_http_port, jp_base_url, jp_auth_header
) -> None:
    """Bob announces 64 MiB and sends 1 KiB: the 413 comes at once, the server never waited
    for (nor buffered) the rest. (jp_fetch: the fixture that makes the server listen.)"""
    assert mlc.max_request_body == 8 << 20
    announced = 64 << 20
    head = (
        f"POST {jp_base_url}mlcluster/api/jobs HTTP/1.1\r\n"
        f"Host: 127.0.0.1:{jp_http_port}\r\n"
        f"Authorization: {jp_auth_header['Authorization']}\r\n"
        f"kubeflow-userid: {BOB}\r\n"
        "Content-Type: application/json\r\n"
        f"Content-Length: {announced}\r\n\r\n"
    )
    answer = await raw_request(jp_http_port, head, b'{"code": "' + b"A" * 1024)
    status_line, _, rest = answer.partition(b"\r\n")
    assert b" 413 " in status_line, answer[:500]
    message = json.loads(rest.partition(b"\r\n\r\n")[2])["message"]
    assert "MLClusterApp.max_request_body" in message and str(8 << 20) in message, message
    assert mlc.service.store.list_jobs()[1] == 0


async def test_attack_schema_error_does_not_echo_a_huge_value(mlc, jp_fetch, jp_ws_fetch) -> None:
    """A `code` over the document's 4 MiB (within the body limit): 400 saying it is too long,
    with a few hundred characters of it, not the 5 MiB back."""
    bob = Caller(jp_fetch, jp_ws_fetch, BOB)
    status, error = await bob.call("POST", "jobs", body={"code": "#" + "A" * (5 << 20)})
    assert status == 400, error
    message = error["message"]
    assert "is too long" in message and f"({(5 << 20) + 3} characters)" in message, message[:300]
    assert len(message) < 400, len(message)
    # Query parameters too.
    status, error = await bob.call("GET", "jobs", params={"limit": "9" * 5000})
    assert status == 400 and len(error["message"]) < 400, error
    assert mlc.service.store.list_jobs()[1] == 0


async def test_a_body_within_the_limit_is_read_whole(mlc, jp_fetch, jp_ws_fetch) -> None:
    """The limit takes nothing from a real request: a body just under it (a 4 MiB cell, the
    largest the document allows) reaches validation whole, here a 403 for its local backend."""
    bob = Caller(jp_fetch, jp_ws_fetch, BOB)
    code = "x = 1\n" + "#" * ((4 << 20) - 6)
    status, error = await bob.call("POST", "jobs", body={"code": code, "backend": "local"})
    assert status == 403 and "local jobs would run" in error["message"], error


def test_the_printed_shared_server_buffers_a_few_mib_per_request() -> None:
    """Tornado buffers a whole body before any handler runs (Jupyter's other routes): the
    printed Deployment caps that at a few MiB, above what the mlcluster API reads."""
    from jupyterlab_mlcluster.server.app import MLClusterApp
    from notebook_controller.server_deploy import server_command

    command = server_command("kubeflow-userid")
    limits = {}
    for arg in command:
        for name in ("max_body_size", "max_buffer_size"):
            if arg.startswith(f"--ServerApp.{name}="):
                limits[name] = int(arg.split("=", 1)[1])
    assert set(limits) == {"max_body_size", "max_buffer_size"}, command
    api_limit = MLClusterApp.max_request_body.default_value
    for name, value in limits.items():
        assert api_limit <= value <= 16 << 20, (name, value)
