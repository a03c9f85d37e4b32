"""One user of a shared server fills the job store's disk (everyone's jobs, logs, results).

Per-job caps (max_log_mib, max_result_mib) bound one job, not how many a user keeps. A
shared server also caps what each user keeps: a number of jobs (MLClusterApp.owner_job_quota)
and the bytes their job directories hold (owner_store_quota_mib). At or over either, a
submission is refused (403, saying so and how to purge), nothing stored; other users are
untouched. A server not shared keeps no quota (its one user's store is theirs).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from .test_attacks import Caller

BOB, ALICE = "bob@example.com", "alice@example.com"
SHARED = {"trust_identity_header": True, "allow_local_jobs_when_shared": True}


async def finished(caller: Caller, code: str) -> dict[str, Any]:
    status, job = await caller.call("POST", "jobs", body={"code": code, "backend": "local"})
    assert status == 201, job
    deadline = time.monotonic() + 120
    while job["state"] not in ("succeeded", "failed", "cancelled"):
        assert time.monotonic() < deadline, job
        await asyncio.sleep(0.1)
        _, job = await caller.call("GET", "jobs", job["id"])
    assert job["state"] == "succeeded", job
    return job


class TestJobCount:
    @pytest.fixture
    def mlc_config(self) -> dict[str, Any]:
        return {"MLClusterApp": {**SHARED, "owner_job_quota": 2, "owner_store_quota_mib": 0}}

    async def test_attack_keeping_more_jobs_than_the_quota_is_refused(
        self, jp_fetch, jp_ws_fetch, mlc
    ) -> None:
        bob, alice = Caller(jp_fetch, jp_ws_fetch, BOB), Caller(jp_fetch, jp_ws_fetch, ALICE)
        first = await finished(bob, "1\n")
        await finished(bob, "2\n")
        status, error = await bob.call("POST", "jobs", body={"code": "3\n", "backend": "local"})
        assert status == 403, error
        message = error["message"]
        assert "owner_job_quota = 2" in message and "purge=true" in message, message
        assert mlc.service.store.list_jobs(owner=BOB)[1] == 2  # nothing stored
        # Alice is not Bob: her own quota.
        await finished(alice, "4\n")
        # Once he purges one, he may submit again.
        status, _ = await bob.call("DELETE", "jobs", first["id"], params={"purge": "true"})
        assert status == 204
        await finished(bob, "5\n")


class TestStoredBytes:
    @pytest.fixture
    def mlc_config(self) -> dict[str, Any]:
        return {"MLClusterApp": {**SHARED, "owner_job_quota": 0, "owner_store_quota_mib": 1}}

    async def test_attack_filling_the_store_past_the_quota_is_refused(
        self, jp_fetch, jp_ws_fetch, mlc
    ) -> None:
        """Bob's job prints 2 MiB (within its own log cap): his next submission is refused,
        nothing stored; Alice's is not."""
        bob, alice = Caller(jp_fetch, jp_ws_fetch, BOB), Caller(jp_fetch, jp_ws_fetch, ALICE)
        await finished(bob, "for _ in range(2048):\n    print('x' * 1023)\n")
        status, error = await bob.call("POST", "jobs", body={"code": "1\n", "backend": "local"})
        assert status == 403, error
        message = error["message"]
        assert "owner_store_quota_mib = 1" in message and "purge=true" in message, message
        assert mlc.service.store.list_jobs(owner=BOB)[1] == 1
        await finished(alice, "2\n")


class TestNotShared:
    async def test_a_server_not_shared_keeps_no_quota(self, api, mlc) -> None:
        assert (mlc.job_quota, mlc.store_quota_bytes) == (0, 0)
        for n in range(3):
            status, job, _ = await api("POST", "jobs", body={"code": f"{n}\n", "backend": "local"})
            assert status == 201, job


class TestSharedDefaults:
    @pytest.fixture
    def mlc_config(self) -> dict[str, Any]:
        return {"MLClusterApp": {"trust_identity_header": True}}

    def test_a_shared_server_has_quotas_unless_told_otherwise(self, mlc) -> None:
        assert (mlc.job_quota, mlc.store_quota_bytes) == (200, 1024 << 20)
