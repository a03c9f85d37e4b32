"""Server extension benchmark: REST latency on a big job store, and event latency.

    python bench/bench_server.py [--jobs 10000] [--requests 200]

Starts a real `jupyter server` (with the extension) on a temporary job store filled with
`--jobs` finished jobs, then measures
- GET /jobs (and friends) latency, sequential requests on one keep-alive connection;
- the time from a rank's print() to the /events "logs" hint, to the line arriving on a
  `logs?follow=true` stream, and from a job's end to its final /events message.
Prints a table (milliseconds).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import http.client
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tornado.httpclient import HTTPRequest
from tornado.websocket import websocket_connect

from jupyterlab_mlcluster.jobs.model import JobSpec, JobState, RankState
from jupyterlab_mlcluster.jobs.record import JobRecord
from jupyterlab_mlcluster.jobs.storage.store import JobStore
from tests.server.live import TOKEN, LiveServer
from tests.server.stream_client import follow_logs

PRINTS = 25
PRINT_EVERY = 0.2
TICKER = f"""
import time
for i in range({PRINTS}):
    print("tick", repr(time.time()), flush=True)
    time.sleep({PRINT_EVERY})
"""


def fill_store(store: JobStore, count: int) -> str:
    """`count` finished jobs (every 10th failed), as the engine leaves them; returns one id."""
    start = time.time() - count
    job_id = ""
    for i in range(count):
        job_id = f"jbench{i:06d}"
        record = JobRecord(
            id=job_id,
            name=f"bench-{i % 50}",
            spec=JobSpec(workers=1 + i % 4),
            created=start + i,
            owner="bench",
            origin={"kind": "python"},
        )
        store.insert_job(record)
        failed = i % 10 == 0
        store.transition(
            job_id,
            JobState.FAILED if failed else JobState.SUCCEEDED,
            started=start + i + 0.1,
            finished=start + i + 0.5,
            error="boom" if failed else None,
        )
        store.update_ranks(
            job_id,
            {
                r: {
                    "state": RankState.SUCCEEDED,
                    "exit_code": 0,
                    "started": start + i + 0.1,
                    "finished": start + i + 0.5,
                    "metrics": {"cpu_percent": 50.0, "memory_bytes": 10**8},
                }
                for r in range(1 + i % 4)
            },
        )
    return job_id


def get_latencies(server: LiveServer, path: str, n: int) -> list[float]:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    headers = {"Authorization": f"token {TOKEN}"}
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        conn.request("GET", f"/mlcluster/api/{path}", headers=headers)
        response = conn.getresponse()
        body = response.read()
        times.append(time.perf_counter() - t0)
        assert response.status == 200, (path, response.status, body[:300])
    conn.close()
    return times


async def event_latencies(server: LiveServer) -> dict[str, list[float]]:
    headers = {"Authorization": f"token {TOKEN}"}
    t0 = time.perf_counter()
    ws = await websocket_connect(
        HTTPRequest(f"ws://127.0.0.1:{server.port}/mlcluster/api/events", headers=headers)
    )
    snapshot = json.loads(await ws.read_message())
    connect = time.perf_counter() - t0
    assert snapshot["type"] == "snapshot"

    status, job = server.request("POST", "jobs", {"code": TICKER, "name": "ticker"})
    assert status == 201, job
    hints: list[float] = []
    final_at: list[float] = []

    async def events() -> None:
        while True:
            message = json.loads(await ws.read_message())
            now = time.time()
            if message.get("id") == job["id"] and message["type"] == "logs":
                hints.append(now)
            if (
                message["type"] == "job"
                and message["job"]["id"] == job["id"]
                and message["job"]["state"] in ("succeeded", "failed")
            ):
                final_at.append(now)
                return

    followed: list[float] = []

    def on_chunk(chunk: bytes) -> None:
        now = time.time()
        for raw in chunk.splitlines():
            line = json.loads(raw)
            if line["line"].startswith("tick "):
                followed.append(now - float(line["line"].split()[1]))

    base_url = f"http://127.0.0.1:{server.port}"
    await asyncio.gather(events(), follow_logs(base_url, headers, job["id"], on_chunk, 120))
    ws.close()
    status, page = server.request("GET", f"jobs/{job['id']}/logs")
    printed = [
        float(entry["line"].split()[1])
        for entry in page["lines"]
        if entry["line"].startswith("tick ")
    ]
    assert len(printed) == PRINTS, page
    # Each print is announced by the first hint after it (prints are PRINT_EVERY apart).
    to_hint = []
    for t in printed:
        later = [h for h in hints if h >= t]
        if later:
            to_hint.append(later[0] - t)
    status, final = server.request("GET", f"jobs/{job['id']}")
    finished = datetime.datetime.fromisoformat(final["finished"].replace("Z", "+00:00")).timestamp()
    return {
        "connect /events + snapshot": [connect],
        "print -> /events logs hint": to_hint,
        "print -> logs?follow=true line": followed,
        "job finished -> /events final state": [final_at[0] - finished],
    }


def row(name: str, values: list[float]) -> str:
    ms = sorted(v * 1000 for v in values)
    p95 = ms[min(len(ms) - 1, round(0.95 * (len(ms) - 1)))]
    return f"{name:<44} {len(ms):>6} {statistics.median(ms):>9.1f} {p95:>9.1f} {ms[-1]:>9.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=10_000, help="finished jobs in the store")
    parser.add_argument("--requests", type=int, default=200, help="requests per REST measurement")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="mlcluster-bench-") as tmp:
        home = Path(tmp)
        store = JobStore(home / "store")
        t0 = time.perf_counter()
        one = fill_store(store, args.jobs)
        print(
            f"filled the store with {args.jobs} jobs in {time.perf_counter() - t0:.1f} s",
            file=sys.stderr,
        )
        server = LiveServer(home, home / "store").start()
        try:
            rows = [
                (
                    f"GET /jobs ({args.jobs} jobs, first 100)",
                    get_latencies(server, "jobs", args.requests),
                ),
                (
                    "GET /jobs?limit=1000",
                    get_latencies(server, "jobs?limit=1000", max(20, args.requests // 10)),
                ),
                (
                    "GET /jobs?state=failed&offset=500",
                    get_latencies(server, "jobs?state=failed&offset=500", args.requests),
                ),
                (
                    "GET /jobs?state=running (none)",
                    get_latencies(server, "jobs?state=running", args.requests),
                ),
                ("GET /jobs/{id}", get_latencies(server, f"jobs/{one}", args.requests)),
                ("GET /cluster", get_latencies(server, "cluster", args.requests)),
            ]
            rows += list(asyncio.run(event_latencies(server)).items())
        finally:
            server.stop()
    print(f"{'measurement (ms)':<44} {'n':>6} {'median':>9} {'p95':>9} {'max':>9}")
    for name, values in rows:
        print(row(name, values))


if __name__ == "__main__":
    main()
