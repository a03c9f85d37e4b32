"""Small helpers shared by the server tests."""

from __future__ import annotations

import asyncio


async def wait_final(api, job_id: str, timeout: float = 60.0) -> dict:
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        code, job, _ = await api("GET", "jobs", job_id)
        assert code == 200
        if job["state"] in ("succeeded", "failed", "cancelled"):
            return job
        assert asyncio.get_running_loop().time() < deadline, f"job still {job['state']}"
        await asyncio.sleep(0.1)


async def submit(api, code: str, **options) -> dict:
    status, job, _ = await api("POST", "jobs", body={"code": code, **options})
    assert status == 201, job
    return job
