"""The /events websocket, followed logs, event-loop health and shutdown behaviour."""

from __future__ import annotations

import asyncio
import datetime
import json
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Self

import pytest
import tornado.httpclient
import tornado.websocket
from tornado.ioloop import PeriodicCallback

from jupyterlab_mlcluster.jobs.model import JobSpec
from jupyterlab_mlcluster.jobs.service import JobService
from jupyterlab_mlcluster.runtime.payload import Payload

from .helpers import submit, wait_final


async def read_until(ws, predicate, timeout: float = 30.0) -> list[dict]:
    """Messages up to and including the first one `predicate` accepts."""
    seen = []
    deadline = time.monotonic() + timeout
    while True:
        remaining = deadline - time.monotonic()
        assert remaining > 0, f"timed out; got {[m['type'] for m in seen]}"
        text = await asyncio.wait_for(ws.read_message(), remaining)
        assert text is not None, "websocket closed"
        message = json.loads(text)
        seen.append(message)
        if predicate(message):
            return seen


def is_job(job_id: str, *states: str):
    return lambda m: (
        m["type"] == "job"
        and m["job"]["id"] == job_id
        and (not states or m["job"]["state"] in states)
    )


async def connect(jp_ws_fetch):
    ws = await jp_ws_fetch("mlcluster", "api", "events")
    snapshot = json.loads(await asyncio.wait_for(ws.read_message(), 10))
    assert snapshot["type"] == "snapshot"
    return ws, snapshot


async def test_snapshot_then_live_job_events(api, mlc, jp_ws_fetch):
    earlier = await submit(api, "pass", name="earlier")
    await wait_final(api, earlier["id"])
    ws, snapshot = await connect(jp_ws_fetch)
    assert [j["id"] for j in snapshot["jobs"]] == [earlier["id"]]
    assert snapshot["jobs"][0]["state"] == "succeeded" and snapshot["total"] == 1
    assert snapshot["cluster"]["backend"] == "local"

    job = await submit(api, "import time\nprint('hello', flush=True)\ntime.sleep(0.5)", workers=2)
    seen = await read_until(ws, is_job(job["id"], "succeeded"))
    states = [m["job"]["state"] for m in seen if is_job(job["id"])(m)]
    assert states[0] in ("queued", "starting") and states[-1] == "succeeded"
    assert "running" in states
    final = seen[-1]["job"]
    assert [r["state"] for r in final["ranks"]] == ["succeeded", "succeeded"]
    assert any(m["type"] == "logs" and m["id"] == job["id"] for m in seen), "log hints are pushed"
    assert [m["seq"] for m in seen] == sorted(m["seq"] for m in seen)
    # A message made before the snapshot may still arrive after it (it was on its way when the
    # snapshot was taken): clients drop it by its seq, as the sidebar's reducer does. Nothing
    # about the job submitted after the snapshot can be among those.
    stale = [m for m in seen if m["seq"] <= snapshot["seq"]]
    assert not [m for m in stale if job["id"] in (m.get("id"), m.get("job", {}).get("id"))], stale
    clusters = [m["cluster"] for m in seen if m["type"] == "cluster"]
    assert any(c["capacity"]["cpus"]["free"] < c["capacity"]["cpus"]["total"] for c in clusters), (
        clusters
    )
    # capacity comes back once the job is done
    if clusters[-1]["capacity"]["cpus"]["free"] != clusters[-1]["capacity"]["cpus"]["total"]:
        more = await read_until(ws, lambda m: m["type"] == "cluster")
        assert (
            more[-1]["cluster"]["capacity"]["cpus"]["free"]
            == more[-1]["cluster"]["capacity"]["cpus"]["total"]
        )

    status, _, _ = await api("DELETE", "jobs", job["id"], params={"purge": "true"})
    assert status == 204
    await read_until(ws, lambda m: m["type"] == "deleted" and m["id"] == job["id"])
    ws.close()


async def test_jobs_of_other_front_ends_show_up_live(api, mlc, jp_ws_fetch, store_dir):
    """A job submitted by another process on the same store (the Python API, as a kernel's
    magic would) appears on /events and in GET /jobs; the server never polls for it."""
    ws, _ = await connect(jp_ws_fetch)
    script = "import jupyterlab_mlcluster as m; job = m.submit('print(42)', workers=2, name='from-python'); print(job.id); job.wait()"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", script, stdout=asyncio.subprocess.PIPE
    )
    output, _ = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0
    job_id = output.decode().split()[0]
    seen = await read_until(ws, is_job(job_id, "succeeded"))
    assert (
        seen[-1]["job"]["name"] == "from-python" and seen[-1]["job"]["origin"]["kind"] == "python"
    )
    _, listing, _ = await api("GET", "jobs")
    assert [j["id"] for j in listing["jobs"]] == [job_id]
    _, page, _ = await api("GET", "jobs", job_id, "logs")
    assert sorted(entry["line"] for entry in page["lines"]) == ["42", "42"]
    ws.close()


async def test_fan_out_to_many_clients_from_one_watcher(api, mlc, jp_ws_fetch):
    clients = [(await connect(jp_ws_fetch))[0] for _ in range(5)]
    job = await submit(api, "pass")
    for ws in clients:
        seen = await read_until(ws, is_job(job["id"], "succeeded"))
        assert seen[-1]["job"]["state"] == "succeeded"
    watchers = [t for t in threading.enumerate() if t.name == "mlcluster-events"]
    assert len(watchers) == 1
    for ws in clients:
        ws.close()
    await asyncio.sleep(0.2)
    assert not mlc.broadcaster._subscribers, "closed clients are forgotten"


async def test_job_events_are_coalesced_to_ten_per_second(api, mlc, jp_ws_fetch):
    job = await submit(api, "pass")
    await wait_final(api, job["id"])
    ws, _ = await connect(jp_ws_fetch)
    # Another writer (as a supervisor would be) changes the job 400 times as fast as it can.
    writer = JobService(config=mlc.mlconfig)

    def hammer():
        for i in range(400):
            writer.store.update_job(job["id"], reason=f"step {i}")

    started = time.monotonic()
    await asyncio.get_running_loop().run_in_executor(None, hammer)
    seen = await read_until(
        ws, lambda m: is_job(job["id"])(m) and m["job"]["reason"] == "step 399", timeout=10
    )
    elapsed = time.monotonic() - started
    events = [m for m in seen if is_job(job["id"])(m)]
    assert len(events) <= 10 * elapsed + 2, f"{len(events)} events in {elapsed:.2f}s"
    assert len(events) < 400
    ws.close()


async def test_websocket_needs_authentication_and_a_same_origin(api, jp_ws_fetch, mlc):
    with pytest.raises(tornado.httpclient.HTTPClientError) as refused:
        await jp_ws_fetch("mlcluster", "api", "events", headers={"Authorization": "token wrong"})
    assert refused.value.code == 403
    # A browser session: the login cookie, and an Origin header the server checks (tokens
    # cannot be sent by other sites, cookies can, so only cookie logins are origin-checked).
    _, _, response = await api("GET", "cluster")
    cookie = "; ".join(c.split(";")[0] for c in response.headers.get_list("Set-Cookie"))
    host = response.effective_url.split("/")[2]  # the cookie's name is tied to the Host
    browser = {"Authorization": "", "Cookie": cookie, "Host": host}
    with pytest.raises(tornado.httpclient.HTTPClientError) as refused:
        await jp_ws_fetch(
            "mlcluster", "api", "events", headers={**browser, "Origin": "http://evil.example"}
        )
    assert refused.value.code == 403
    assert not mlc.broadcaster._subscribers
    same_origin = {**browser, "Origin": f"http://{host}"}
    ws = await jp_ws_fetch("mlcluster", "api", "events", headers=same_origin)
    assert json.loads(await asyncio.wait_for(ws.read_message(), 10))["type"] == "snapshot"
    ws.close()


async def test_plain_get_of_the_websocket_is_426(api):
    status, error, _ = await api("GET", "events")
    assert status == 426 and "websocket" in error["message"]


# -- followed logs ---------------------------------------------------------------------------


async def follow_raw(jp_fetch, job_id: str, **params) -> tuple[bytes, list[float]]:
    """The NDJSON body of a followed log, and when each chunk arrived."""
    chunks: list[bytes] = []
    arrivals: list[float] = []

    def on_chunk(chunk: bytes) -> None:
        chunks.append(chunk)
        arrivals.append(time.time())

    response = await jp_fetch(
        "mlcluster",
        "api",
        "jobs",
        job_id,
        "logs",
        params={"follow": "true", **params},
        streaming_callback=on_chunk,
        request_timeout=120,
    )
    assert response.code == 200
    assert response.headers["Content-Type"] == "application/x-ndjson"
    data = b"".join(chunks)
    assert data.endswith(b"\n") or not data
    return data, arrivals


async def follow(jp_fetch, job_id: str, **params) -> tuple[list[dict], list[float]]:
    data, arrivals = await follow_raw(jp_fetch, job_id, **params)
    return [json.loads(line) for line in data.splitlines()], arrivals


async def test_follow_streams_until_the_job_ends(api, mlc, jp_fetch):
    code = textwrap.dedent(
        """
        import os, time
        for i in range(5):
            print(f"{os.environ['RANK']}:{i}", flush=True)
            time.sleep(0.2)
        """
    )
    job = await submit(api, code, workers=2)
    lines, arrivals = await follow(jp_fetch, job["id"])
    out = [entry for entry in lines if entry["stream"] == "stdout"]
    for rank in (0, 1):
        assert [entry["line"] for entry in out if entry["rank"] == rank] == [
            f"{rank}:{i}" for i in range(5)
        ]
    _status, job_now, _ = await api("GET", "jobs", job["id"])
    assert job_now["state"] == "succeeded", "the stream ends only when the job is final"
    finished = datetime.datetime.fromisoformat(
        job_now["finished"].replace("Z", "+00:00")
    ).timestamp()
    assert len(arrivals) > 2 and arrivals[0] < finished - 0.5, "lines arrive while the job runs"
    # following a finished job returns everything at once; rank and tail work too
    again, _ = await follow(jp_fetch, job["id"], rank="1", tail="2")
    assert [entry["line"] for entry in again if entry["stream"] == "stdout"] == ["1:3", "1:4"]


FLAT_OUT = textwrap.dedent(
    """
    import os, time
    os.nice(10)
    end = time.time() + 3.0
    i = 0
    while time.time() < end:
        print("x" * 60, i)
        i += 1
    """
)


async def test_a_follower_that_hangs_up_is_let_go(
    api, mlc, jp_http_port, jp_base_url, jp_serverapp
):
    job = await submit(api, "import time\nprint('hello', flush=True)\ntime.sleep(60)")
    reader, writer = await asyncio.open_connection("127.0.0.1", jp_http_port)
    token = jp_serverapp.identity_provider.token
    writer.write(
        f"GET {jp_base_url}mlcluster/api/jobs/{job['id']}/logs?follow=true HTTP/1.1\r\n"
        f"Host: 127.0.0.1:{jp_http_port}\r\nAuthorization: token {token}\r\n\r\n".encode()
    )
    await writer.drain()
    received = b""
    while b"hello" not in received:
        received += await asyncio.wait_for(reader.read(65536), 30)
    assert b"application/x-ndjson" in received
    assert job["id"] in mlc.broadcaster._job_waiters
    writer.close()
    # Within 0.3 s: sooner than the job's next change (metrics come once a second).
    for _ in range(15):
        if job["id"] not in mlc.broadcaster._job_waiters:
            break
        await asyncio.sleep(0.02)
    assert job["id"] not in mlc.broadcaster._job_waiters, "the follower is gone at once"
    await api("DELETE", "jobs", job["id"])


class LoopLateness:
    """A 10 ms periodic callback's lateness: how long the event loop could not run it.

    Each tick also reads how long the loop thread sat runnable but off-CPU since the last
    tick (Linux schedstat). That part is the OS giving the CPU to other processes (this is
    a shared 2-core machine); the rest is the server's own doing: work on the loop, or the
    GIL held by its threads."""

    interval = 0.01

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.raw: list[float] = []
        self.own: list[float] = []
        self._schedstat = Path(f"/proc/self/task/{threading.get_native_id()}/schedstat")
        self._expected = self.loop.time() + self.interval
        self._waited = self._runqueue_wait()
        self._ticker = PeriodicCallback(self._tick, self.interval * 1000)

    def _runqueue_wait(self) -> float:
        try:
            return int(self._schedstat.read_text().split()[1]) / 1e9
        except (OSError, IndexError, ValueError):
            return 0.0  # no schedstat: count everything as the server's

    def _tick(self) -> None:
        now, waited = self.loop.time(), self._runqueue_wait()
        late = max(0.0, now - self._expected)
        self.raw.append(late)
        self.own.append(max(0.0, late - (waited - self._waited)))
        self._expected, self._waited = now + self.interval, waited

    def __enter__(self) -> Self:
        self._ticker.start()
        return self

    def __exit__(self, *exc) -> None:
        self._ticker.stop()

    @staticmethod
    def summary(values: list[float]) -> tuple[float, float]:
        ordered = sorted(values)
        return ordered[-1], ordered[int(len(ordered) * 0.99)]


async def test_event_loop_stays_responsive_while_four_ranks_print_flat_out(
    api, mlc, jp_serverapp, jp_http_port, jp_base_url
):
    """Event-loop stalls < 50 ms (p99; worst < 250 ms) while 4 ranks print as fast as they can, with a
    websocket client and a log follower (in another process, as a browser would be)
    connected.

    The ranks lower their own CPU priority: this machine has 2 cores, and 4 flat-out ranks
    plus their supervisor at equal priority would measure the OS scheduler's time slices
    rather than anything the server does. For the same reason the assertion subtracts the
    time the OS kept the loop thread waiting for a CPU (other tenants of this machine); the
    raw lateness is printed beside it."""
    with LoopLateness() as lateness:
        await asyncio.sleep(0.5)
        idle = len(lateness.raw)
        job = await submit(api, FLAT_OUT, workers=4)
        client = await asyncio.create_subprocess_exec(
            sys.executable,
            str(Path(__file__).with_name("stream_client.py")),
            f"http://127.0.0.1:{jp_http_port}{jp_base_url.rstrip('/')}",
            jp_serverapp.identity_provider.token,
            job["id"],
            stdout=asyncio.subprocess.PIPE,
        )
        output, _ = await asyncio.wait_for(client.communicate(), 120)
    assert client.returncode == 0
    summary = json.loads(output)
    final = await wait_final(api, job["id"])
    assert final["state"] == "succeeded", final["error"]
    assert sorted(summary["stdout"]) == ["0", "1", "2", "3"]
    assert all(summary["in_order"].values()), "complete and in order"
    printed = sum(summary["stdout"].values())
    raw_worst, raw_p99 = LoopLateness.summary(lateness.raw[idle:])
    own_worst, own_p99 = LoopLateness.summary(lateness.own[idle:])
    print(
        f"\n4 ranks printed {printed} lines ({summary['bytes'] / 1e6:.0f} MB of NDJSON followed), "
        f"{summary['ws_messages']} ws messages; loop lateness over {len(lateness.raw) - idle} ticks: "
        f"worst {raw_worst * 1000:.1f} ms (p99 {raw_p99 * 1000:.1f}), of which not waiting for a CPU: "
        f"worst {own_worst * 1000:.1f} ms (p99 {own_p99 * 1000:.1f}); idle worst {max(lateness.raw[:idle]) * 1000:.1f} ms"
    )
    assert printed > 10_000, "the ranks really printed flat out"
    # Work done on the loop shows in most ticks (p99); one tick's worst also meets what no
    # code path causes (a GC pass, the GIL held by a C call of another thread) and measured
    # up to ~50 ms on a loaded CI machine, so it is bounded at what a blocking read would
    # cost, not at the p99's bound.
    assert own_p99 < 0.050, f"event loop stalled {own_p99 * 1000:.1f} ms at p99"
    assert own_worst < 0.250, f"event loop stalled {own_worst * 1000:.1f} ms"


# -- shutdown --------------------------------------------------------------------------------


def _submit_directly(service: JobService, code: str, **origin) -> str:
    return service.submit(JobSpec.from_options({}), Payload(source=code), origin=origin or None).id


async def test_stopping_the_server_leaves_jobs_running(api, mlc):
    job = await submit(api, "import time\ntime.sleep(30)")
    for _ in range(100):
        if (await api("GET", "jobs", job["id"]))[1]["state"] == "running":
            break
        await asyncio.sleep(0.1)
    await mlc.stop_extension()
    assert not any(t.name == "mlcluster-events" for t in threading.enumerate())
    service = JobService(config=mlc.mlconfig)
    await asyncio.sleep(0.5)
    assert service.get(job["id"]).state.value == "running"
    service.cancel(job["id"])


@pytest.fixture
def mlc_config():
    return {}


@pytest.mark.parametrize("mlc_config", [{"MLClusterApp": {"cancel_jobs_on_shutdown": True}}])
async def test_cancel_jobs_on_shutdown_cancels_only_this_servers_jobs(api, mlc, mlc_config):
    mine = await submit(api, "import time\ntime.sleep(30)")
    other_service = JobService(config=mlc.mlconfig)
    other = _submit_directly(other_service, "import time\ntime.sleep(30)", kind="python")
    await asyncio.sleep(0.5)
    await mlc.stop_extension()
    assert other_service.get(mine["id"]).state.value == "cancelled"
    assert other_service.get(other).state.value in ("queued", "starting", "running")
    other_service.cancel(other)
