"""The server extension records its pod's Python environment when it starts (once per pod:
Kubernetes jobs' pods install what is pip-installed later), and `sync_packages` travels
through REST like every job option."""

from __future__ import annotations

import asyncio
import json

from jupyterlab_mlcluster import environment


async def test_the_server_records_the_environment_and_takes_sync_packages(api, store_dir):
    path = environment.baseline_path(store_dir)
    for _ in range(200):  # written by the extension's executor, off the event loop
        if path.exists():
            break
        await asyncio.sleep(0.05)
    recorded = json.loads(path.read_text())["image"]
    assert recorded["jupyter-server"] and recorded["tornado"]  # this environment's, as started

    status, job, _ = await api(
        "POST", "jobs", body={"code": "1", "sync_packages": False, "backend": "local"}
    )
    assert status == 201, job
    assert job["sync_packages"] is False
    status, body, _ = await api("POST", "jobs", body={"code": "1", "sync_packages": "no"})
    assert status == 400 and "sync_packages" in body["message"]
    status, job, _ = await api("GET", "jobs", job["id"])
    assert job["sync_packages"] is False
