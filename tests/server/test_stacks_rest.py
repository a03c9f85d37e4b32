"""`GET /jobs/{id}/stacks` (issue 33) on a server shared through the identity header: the
caller's own running job is read now (real ranks, py-spy), a cancelled one answers with the
stacks it kept; another user's job is 404 and nothing of it reaches them; a rank the job
does not have is 404, a malformed query 400, a job that kept none 409."""

from __future__ import annotations

import asyncio
import textwrap
import time
from typing import Any

import pytest

from .test_attacks import ALICE, MALLORY, Caller

CODE = textwrap.dedent(
    """\
    import time

    def wait_here():
        time.sleep(600)

    print("ready", flush=True)
    wait_here()
    """
)


@pytest.fixture
def mlc_config() -> dict[str, Any]:
    return {
        "MLClusterApp": {"trust_identity_header": True, "allow_local_jobs_when_shared": True},
        "MLClusterConfig": {"cpu_slots": 2},
    }


async def _until(check, timeout: float = 180.0):
    deadline = time.monotonic() + timeout
    while True:
        value = await check()
        if value:
            return value
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.2)


async def test_stacks_of_ones_own_job_only(jp_fetch, jp_ws_fetch, mlc):
    alice = Caller(jp_fetch, jp_ws_fetch, ALICE)
    mallory = Caller(jp_fetch, jp_ws_fetch, MALLORY)
    status, job = await alice.call(
        "POST", "jobs", body={"code": CODE, "workers": 2, "framework": "none"}
    )
    assert status == 201, job
    job_id = job["id"]

    async def both_waiting():
        status, report = await alice.call("GET", "jobs", job_id, "stacks")
        if status == 409:  # not running yet
            return None
        assert status == 200, report
        texts = [f["text"] for f in report["folds"]]
        return report if "ranks 0, 1: wait_here (cell.py:4): time.sleep(600)" in texts else None

    report = await _until(both_waiting)
    assert report["live"] and report["complete"] and report["readers"] == ["py-spy"]
    assert [r["rank"] for r in report["ranks"]] == [0, 1] and report["why"] == "asked"

    status, one = await alice.call("GET", "jobs", job_id, "stacks", params={"rank": "1"})
    assert status == 200 and [r["rank"] for r in one["ranks"]] == [1]
    status, error = await alice.call("GET", "jobs", job_id, "stacks", params={"rank": "2"})
    assert status == 404 and "has no rank 2: its ranks are 0 to 1" in error["message"]
    status, error = await alice.call("GET", "jobs", job_id, "stacks", params={"native": "maybe"})
    assert status == 400

    # Mallory asks for alice's job by id and by name: as if it did not exist.
    for ref in (job_id, job["name"]):
        status, error = await mallory.call("GET", "jobs", ref, "stacks")
        assert status == 404, error
    assert not mallory.saw("wait_here") and not mallory.saw(job_id + '"')

    status, cancelled = await alice.call("DELETE", "jobs", job_id)
    assert status == 200, cancelled

    async def kept():
        status, report = await alice.call("GET", "jobs", job_id, "stacks")
        return report if status == 200 and not report["live"] else None

    report = await _until(kept, 60)
    assert report["why"] == "cancelled"
    assert [f["text"] for f in report["folds"]] == [
        "ranks 0, 1: wait_here (cell.py:4): time.sleep(600)"
    ]
    status, error = await mallory.call("GET", "jobs", job_id, "stacks")
    assert status == 404

    status, quick = await alice.call("POST", "jobs", body={"code": "1", "framework": "none"})
    assert status == 201

    async def ended():
        status, job = await alice.call("GET", "jobs", quick["id"])
        return job if job["state"] == "succeeded" else None

    await _until(ended)
    status, error = await alice.call("GET", "jobs", quick["id"], "stacks")
    assert status == 409 and "it kept no stacks" in error["message"]
