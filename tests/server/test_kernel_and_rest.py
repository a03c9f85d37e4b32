"""One job service for magic and REST: a job submitted over REST is attached from a kernel,
and a job submitted by %%distributed shows up in GET /jobs and on /events."""

from __future__ import annotations

import asyncio
import json
import os
import threading

from helpers import start_kernel
from kernel_session import KernelSession, outputs, rank_texts

from .helpers import submit


async def in_kernel(*cells: str) -> list[tuple[list, dict]]:
    """Run cells in a fresh kernel (jupyter_client's sync API, in a thread of its own so it
    can have its own event loop beside the test server's) and shut it down."""

    def work():
        asyncio.set_event_loop(asyncio.new_event_loop())
        km, kc = start_kernel(kernel_name="python3", env=dict(os.environ))
        try:
            session = KernelSession(km, kc)
            return [session.execute(cell) for cell in cells]
        finally:
            kc.stop_channels()
            km.shutdown_kernel(now=True)

    result: dict = {}
    thread = threading.Thread(target=lambda: result.update(value=work()))
    thread.start()
    while thread.is_alive():
        await asyncio.sleep(0.1)  # keep serving the test server meanwhile
    return result["value"]


async def test_rest_job_attached_from_a_kernel(api):
    job = await submit(
        api,
        "import os, time\ntime.sleep(1)\nprint('hi from', os.environ['RANK'])\n{'answer': 42}",
        workers=2,
    )
    ((msgs, reply),) = await in_kernel(f"%distributed_attach {job['id']}")
    assert reply["status"] == "ok", reply
    assert outputs(msgs, "execute_result")[0]["data"]["text/plain"] == "{'answer': 42}"
    assert rank_texts(msgs) == {0: "[rank 0] hi from 0", 1: "[rank 1] hi from 1"}


async def test_magic_job_shows_in_rest_and_events(api, jp_ws_fetch):
    ws = await jp_ws_fetch("mlcluster", "api", "events")
    snapshot = json.loads(await asyncio.wait_for(ws.read_message(), 10))
    assert snapshot["jobs"] == []
    ((msgs, reply),) = await in_kernel("%%distributed --workers 2 --name from-magic\nprint('x')")
    assert reply["status"] == "ok", reply
    code, page, _ = await api("GET", "jobs")
    (job,) = page["jobs"]
    assert (
        job["name"] == "from-magic"
        and job["state"] == "succeeded"
        and job["origin"]["kind"] == "kernel"
    )
    seen = []
    while not any(m.get("type") == "job" and m["job"]["state"] == "succeeded" for m in seen):
        seen.append(json.loads(await asyncio.wait_for(ws.read_message(), 10)))
    assert {m["job"]["id"] for m in seen if m.get("type") == "job"} == {job["id"]}
    ws.close()
