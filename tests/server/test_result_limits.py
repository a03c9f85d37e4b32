"""What reading results may cost the server (GET /jobs/{id}/result).

The route used to read up to max_result_mib (1 GiB) of a result's JSON form, decode it and
encode it again, several times its size in memory, for anyone whose job wrote one. The JSON
form is now served as stored, streamed, and refused (409, saying why) past
MLClusterConfig.max_result_json_mib, judged by its size before any of it is read.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest


@pytest.fixture
def mlc_config() -> dict[str, Any]:
    return {"MLClusterConfig": {"max_result_json_mib": 1}}


async def _finished(api, code: str) -> dict[str, Any]:
    status, job, _ = await api("POST", "jobs", body={"code": code, "backend": "local"})
    assert status == 201, job
    deadline = time.monotonic() + 120
    while job["state"] not in ("succeeded", "failed", "cancelled"):
        assert time.monotonic() < deadline, job
        await asyncio.sleep(0.1)
        _, job, _ = await api("GET", "jobs", job["id"])
    assert job["state"] == "succeeded", job
    return job


async def test_attack_a_json_form_over_the_cap_is_refused_unread(api, mlc) -> None:
    """80 000 floats: a pickle under the rank's own JSON_FORM_MAX, so the rank writes its
    JSON form (about 1.5 MiB), over this server's 1 MiB: 409 naming the cap."""
    job = await _finished(api, "import random\n[random.random() for _ in range(80000)]\n")
    stored = mlc.service.store.result_json_path(job["id"])
    assert stored.stat().st_size > 1 << 20
    status, error, _ = await api("GET", "jobs", job["id"], "result")
    assert status == 409, error
    assert "MLClusterConfig.max_result_json_mib" in error["message"], error
    assert "get_job(" in error["message"]  # and how to read it in Python


async def test_a_result_is_served_as_stored(api, mlc) -> None:
    """Streamed as the rank wrote it: the bytes of its JSON form, which decode to the value."""
    job = await _finished(api, "{'answer': 42, 'items': list(range(1000))}\n")
    status, body, response = await api("GET", "jobs", job["id"], "result")
    assert status == 200, body
    assert body == {"kind": "value", "value": {"answer": 42, "items": list(range(1000))}}
    assert response.body == mlc.service.store.result_json_path(job["id"]).read_bytes()


async def test_a_stored_form_of_the_wrong_shape_is_not_served(api, mlc) -> None:
    """Only the shape is checked (its head, its last byte), cheaply: a file that is not what
    the runtime writes answers 409, not whatever it holds."""
    job = await _finished(api, "7\n")
    stored = mlc.service.store.result_json_path(job["id"])
    for text in (b'{"value": 1, "kind": "value"', b"<html>", json.dumps([1, 2]).encode()):
        stored.write_bytes(text)
        status, error, _ = await api("GET", "jobs", job["id"], "result")
        assert status == 409 and "not readable" in error["message"], (text, error)
