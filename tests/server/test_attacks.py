"""User B (mallory) against user A (alice) on a server shared through an authenticating
proxy (`trust_identity_header`): every job route and the /events stream are scoped to the
caller. Each test is one named attack; each shows it refused (404 as for a missing job, so
nobody learns which jobs exist; 403 without an identity) and A's job untouched.

A real Jupyter server (pytest-jupyter), real supervisors and rank processes.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest

ALICE, MALLORY = "alice@example.com", "mallory@example.com"
SECRET = "alice-token-5f2b9c"  # in alice's job env: must never reach mallory


@pytest.fixture
def mlc_config() -> dict[str, Any]:
    # One rank slot: alice's second job waits in the queue while her first one runs. The
    # routes' scoping is played with local jobs (no cluster needed), which a shared server
    # refuses unless told (test_shared_local_jobs.py): the opt-out keeps everything else as
    # on any shared server (per-user namespaces), and scoping must hold there too.
    return {
        "MLClusterApp": {"trust_identity_header": True, "allow_local_jobs_when_shared": True},
        "MLClusterConfig": {"cpu_slots": 1},
    }


class Caller:
    """One user's REST calls and /events websocket; everything received is kept, so a test
    can check that nothing of another user's ever arrived."""

    def __init__(self, jp_fetch: Any, jp_ws_fetch: Any, name: str | None):
        self.fetch, self.ws_fetch = jp_fetch, jp_ws_fetch
        self.headers = {"kubeflow-userid": name} if name else {}
        self.received: list[str] = []
        self.messages: list[dict[str, Any]] = []
        self.ws: Any = None

    async def call(self, method: str, *path: str, body: Any = None, params=None):
        response = await self.fetch(
            "mlcluster",
            "api",
            *path,
            method=method,
            body=json.dumps(body) if body is not None else ("" if method == "POST" else None),
            params=params,
            headers=dict(self.headers),
            raise_error=False,
            allow_nonstandard_methods=True,
        )
        text = response.body.decode() if response.body else ""
        self.received.append(text)
        try:
            data = json.loads(text) if text else None
        except ValueError:
            data = None  # ndjson (followed logs)
        return response.code, data

    async def connect(self) -> dict[str, Any]:
        self.ws = await self.ws_fetch("mlcluster", "api", "events", headers=dict(self.headers))
        snapshot = await self.next_message(10)
        assert snapshot["type"] == "snapshot"
        return snapshot

    async def next_message(self, timeout: float) -> dict[str, Any]:
        text = await asyncio.wait_for(self.ws.read_message(), timeout)
        assert text is not None, "websocket closed"
        self.received.append(text)
        message = json.loads(text)
        self.messages.append(message)
        return message

    async def drain(self, seconds: float) -> None:
        """Read whatever arrives for `seconds`."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            try:
                await self.next_message(left)
            except TimeoutError:
                return

    def saw(self, text: str) -> bool:
        return any(text in r for r in self.received)


@pytest.fixture
def users(jp_fetch, jp_ws_fetch, mlc):
    alice = Caller(jp_fetch, jp_ws_fetch, ALICE)
    mallory = Caller(jp_fetch, jp_ws_fetch, MALLORY)
    yield alice, mallory
    for caller in (alice, mallory):
        if caller.ws is not None:
            caller.ws.close()


async def alice_job(alice: Caller, code: str, **options) -> dict[str, Any]:
    status, job = await alice.call(
        "POST",
        "jobs",
        body={"code": code, "name": "alice-train", "env": {"TOKEN": SECRET}, **options},
    )
    assert status == 201, job
    assert job["owner"] == ALICE and job["env"] == {"TOKEN": SECRET}
    return job


async def test_attack_list_and_read_anothers_jobs(users):
    """Mallory lists jobs, reads alice's by id and by name, her logs, metrics and result."""
    alice, mallory = users
    job = await alice_job(alice, "print('alice was here', flush=True)\n6 * 7")
    final = await _wait(alice, job["id"])
    assert final["state"] == "succeeded"

    status, page = await mallory.call("GET", "jobs")
    assert status == 200 and page["jobs"] == [] and page["total"] == 0
    for ref in (job["id"], "alice-train"):
        for path in [(), ("logs",), ("metrics",), ("result",)]:
            status, body = await mallory.call("GET", "jobs", ref, *path)
            assert status == 404, (ref, path, status, body)
            assert body["message"] == f"no job {ref!r}", body  # as for a job nobody has
    status, _ = await mallory.call("GET", "jobs", job["id"], "logs", params={"follow": "true"})
    assert status == 404
    assert not mallory.saw(SECRET) and not mallory.saw("alice was here")

    # The owner still sees everything of hers.
    status, page = await alice.call("GET", "jobs")
    assert [j["id"] for j in page["jobs"]] == [job["id"]]
    status, result = await alice.call("GET", "jobs", job["id"], "result")
    assert status == 200 and result == {"kind": "value", "value": 42}


async def test_attack_track_mlflow_into_the_servers_own_local_store_is_refused(users):
    """T3: a shared server naming no MLflow tracking server would record every user's runs
    (logs, code, results) in one local store of its account: `track: mlflow` is refused
    saying what the operator sets, and nothing is stored."""
    alice, _ = users
    status, body = await alice.call(
        "POST", "jobs", body={"code": "1", "name": "tracked", "track": "mlflow"}
    )
    assert status == 403 and "MLClusterConfig.mlflow_tracking_uri" in body["message"], body
    status, page = await alice.call("GET", "jobs")
    assert status == 200 and not [j for j in page["jobs"] if j["name"] == "tracked"]


async def test_attack_cancel_and_purge_anothers_job(users):
    """Mallory cancels alice's running job, then tries to purge it: both 404, it runs on."""
    alice, mallory = users
    job = await alice_job(alice, "import time\nfor _ in range(600): time.sleep(0.1)")
    await _wait(alice, job["id"], states=("running",))
    for params in (None, {"purge": "true"}):
        status, body = await mallory.call("DELETE", "jobs", job["id"], params=params)
        assert status == 404, body
    status, body = await mallory.call("DELETE", "jobs", "alice-train")
    assert status == 404, body
    status, current = await alice.call("GET", "jobs", job["id"])
    assert status == 200 and current["state"] == "running"
    status, _ = await alice.call("DELETE", "jobs", job["id"], params={"purge": "true"})
    assert status == 204


async def test_attack_cluster_queue_and_events_leak(users):
    """Mallory watches /events and /cluster while alice runs one job and queues another:
    she hears of neither (snapshot, changes, deletion), and the queue shows her nothing."""
    alice, mallory = users
    await mallory.connect()
    await alice.connect()
    running = await alice_job(alice, "import time\nfor _ in range(600): time.sleep(0.1)")
    await _wait(alice, running["id"], states=("running",))
    queued = await alice_job(alice, "pass")
    await _wait(alice, queued["id"], states=("queued",))

    status, cluster = await mallory.call("GET", "cluster")
    assert status == 200 and cluster["queue"] == [] and cluster["running"] == []
    status, cluster = await alice.call("GET", "cluster")
    assert cluster["queue"] == [queued["id"]] and cluster["running"] == [running["id"]]

    # A second connection of mallory's: its snapshot has nothing of alice's either.
    late = Caller(mallory.fetch, mallory.ws_fetch, MALLORY)
    snapshot = await late.connect()
    assert snapshot["jobs"] == [] and snapshot["total"] == 0
    assert snapshot["cluster"]["queue"] == [] and snapshot["cluster"]["running"] == []
    late.ws.close()

    for job in (running, queued):
        status, _ = await alice.call("DELETE", "jobs", job["id"], params={"purge": "true"})
        assert status == 204
    # Alice hears of her deletions; by then mallory would have heard of them too.
    while not {m.get("id") for m in alice.messages if m["type"] == "deleted"} >= {
        running["id"],
        queued["id"],
    }:
        await alice.next_message(20)
    await mallory.drain(1.0)
    ids = (running["id"], queued["id"])
    assert not [m for m in mallory.messages if any(i in json.dumps(m) for i in ids)]
    assert not mallory.saw(SECRET)
    assert any(m["type"] == "job" and m["job"]["id"] == running["id"] for m in alice.messages)


async def test_attack_without_identity(users, jp_fetch, jp_ws_fetch):
    """A request the proxy did not label (no header, or a blank one) gets nothing: 403."""
    alice, _ = users
    job = await alice_job(alice, "pass")
    for headers in ({}, {"kubeflow-userid": "  "}):
        anonymous = Caller(jp_fetch, jp_ws_fetch, None)
        anonymous.headers = headers
        for method, path in [
            ("GET", ("jobs",)),
            ("GET", ("jobs", job["id"])),
            ("GET", ("jobs", job["id"], "logs")),
            ("DELETE", ("jobs", job["id"])),
            ("GET", ("cluster",)),
        ]:
            status, body = await anonymous.call(method, *path)
            assert status == 403 and "kubeflow-userid" in body["message"], (path, body)
        status, body = await anonymous.call("POST", "jobs", body={"code": "pass"})
        assert status == 403, body
        with pytest.raises(Exception) as refused:
            await jp_ws_fetch("mlcluster", "api", "events", headers=headers)
        assert getattr(refused.value, "code", None) == 403, refused.value
    await _wait(alice, job["id"])


async def _wait(caller: Caller, job_id: str, states=("succeeded", "failed", "cancelled")):
    deadline = time.monotonic() + 60
    while True:
        status, job = await caller.call("GET", "jobs", job_id)
        assert status == 200, job
        if job["state"] in states:
            return job
        assert time.monotonic() < deadline, f"job still {job['state']}"
        await asyncio.sleep(0.1)
