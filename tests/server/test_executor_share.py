"""A shared server's executor threads are everyone's: no user's requests may hold them all.

The red team's finding: Bob's eight restarts of a session (each waiting up to 60 s in an
executor thread) made Carol's `GET /jobs` wait 58 s. Stops and restarts now wait on the
event loop, holding no thread, and every caller holds at most
`MLClusterApp.executor_threads_per_caller` threads at once."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from .test_attacks import ALICE, MALLORY, Caller, _wait

IGNORES_SIGTERM = (
    "import signal, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "print('holding', flush=True)\n"
    "time.sleep(600)\n"
)


@pytest.fixture
def mlc_config() -> dict[str, Any]:
    return {
        "MLClusterApp": {
            "trust_identity_header": True,
            "allow_local_jobs_when_shared": True,
            "executor_threads": 4,
            "executor_threads_per_caller": 2,
        },
        # Mallory's rank ignores SIGTERM: each stop waits out this grace before SIGKILL.
        "MLClusterConfig": {"cpu_slots": 1, "kill_grace_period": 15.0},
    }


async def test_attack_a_users_slow_stops_do_not_make_others_wait(jp_fetch, jp_ws_fetch, mlc):
    alice = Caller(jp_fetch, jp_ws_fetch, ALICE)
    mallory = Caller(jp_fetch, jp_ws_fetch, MALLORY)
    status, job = await mallory.call("POST", "jobs", body={"code": IGNORES_SIGTERM})
    assert status == 201, job
    await _wait(mallory, job["id"], states=("running",))
    deadline = time.monotonic() + 60
    while not any("holding" in line["line"] for line in mlc.service.logs(job["id"])[0]):
        assert time.monotonic() < deadline, "mallory's rank never started"
        await asyncio.sleep(0.05)

    # Six stops at once: each waits for the 15 s grace. Before, each held an executor thread
    # for it (the server has 4), and Alice waited behind them.
    stops = [asyncio.ensure_future(mallory.call("DELETE", "jobs", job["id"])) for _ in range(6)]
    # Until all six wait for the job's end (here: on the event loop, as the broadcaster's
    # waiters), or 2 s (before the fix, each in an executor thread or queued for one).
    arrived = time.monotonic() + 2
    while len(mlc.broadcaster._job_waiters.get(job["id"], ())) < 6:
        if time.monotonic() > arrived and mlc.service.store.cancel_requested(job["id"]):
            break
        assert time.monotonic() < deadline, "the stop was never asked"
        await asyncio.sleep(0.02)
    status, page = await alice.call("GET", "jobs")
    assert status == 200 and page["jobs"] == []
    pending = sum(not stop.done() for stop in stops)
    assert pending == 6, f"Alice was answered only after {6 - pending} of Mallory's stops"

    results = await asyncio.gather(*stops)
    assert [status for status, _ in results] == [200] * 6
    assert {body["state"] for _, body in results} == {"cancelled"}


async def test_a_callers_blocking_calls_hold_at_most_their_share():
    from jupyterlab_mlcluster.server.caller_slots import CallerSlots

    slots = CallerSlots(per_caller=2)
    inside: dict[str, int] = {"bob": 0, "carol": 0}
    most = {"bob": 0, "carol": 0}
    release = asyncio.Event()

    async def call(caller: str) -> None:
        async with slots.hold(caller):
            inside[caller] += 1
            most[caller] = max(most[caller], inside[caller])
            await release.wait()
            inside[caller] -= 1

    bobs = [asyncio.ensure_future(call("bob")) for _ in range(5)]
    await asyncio.sleep(0)  # let every one of Bob's calls start waiting for a slot
    carol = asyncio.ensure_future(call("carol"))
    while inside["carol"] == 0:  # Carol gets in while Bob's five hold or wait
        await asyncio.sleep(0)
    assert inside["bob"] == 2 and slots.in_flight("bob") == 5
    release.set()
    await asyncio.gather(*bobs, carol)
    assert most == {"bob": 2, "carol": 1}
    assert slots.in_flight("bob") == 0 and slots._slots == {}


async def test_restarting_a_session_that_is_not_running_is_refused_at_once(
    jp_fetch, jp_ws_fetch, mlc
):
    """A restart used to wait up to 60 s in an executor thread for a queued session, and
    left the request behind, so the session restarted as soon as it started."""
    from jupyterlab_mlcluster.jobs import sessions
    from jupyterlab_mlcluster.runtime.payload import Payload

    mallory = Caller(jp_fetch, jp_ws_fetch, MALLORY)
    status, job = await mallory.call("POST", "jobs", body={"code": "import time; time.sleep(600)"})
    assert status == 201, job
    await _wait(mallory, job["id"], states=("running",))
    # The one slot is held: the session's gang waits in the queue.
    await asyncio.to_thread(
        sessions.submit_cell,
        mlc.service,
        "q",
        {"workers": 1},
        Payload(kind="code", source="1"),
        origin={"kind": "test", "user": MALLORY},
    )
    started = time.monotonic()
    status, body = await mallory.call("POST", "sessions", "q", "restart")
    assert (
        status == 409
        and "session 'q' is queued: only a running session restarts" in (body["message"])
    ), body
    assert time.monotonic() - started < 30  # refused, not waited out (the wait was 60 s)
    (row,) = mlc.service.store.session_rows(MALLORY, "q")
    assert not row.get("restart_requested")
    status, stopped = await mallory.call("DELETE", "sessions", "q")
    assert status == 200 and stopped["state"] == "cancelled", stopped
