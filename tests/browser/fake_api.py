"""Canned answers of /mlcluster/api, served inside the browser by Playwright routing.

For frontend-only browser tests: states the real server makes hard to reach on demand
(a 100k-line log, a 503 "no cluster", a dropped event stream) and exact assertions on what
the panel requests. The end-to-end tests run against the real server extension instead.
"""

from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlparse

# Sent to the browser too, so JavaScript regex syntax only (no named groups).
API = re.compile(r"/mlcluster/api/(?!events)")
API_PATH = re.compile(r"/mlcluster/api/([^?]*)")
EVENTS = re.compile(r".*/mlcluster/api/events(\?.*)?$")


def job(
    id: str,
    name: str,
    state: str = "running",
    workers: int = 2,
    *,
    rank_states: list[str] | None = None,
    created: str = "2026-11-22T01:00:00.000Z",
    **extra: Any,
) -> dict[str, Any]:
    """A job in the REST shape of docs/ARCHITECTURE.md."""
    ranks = rank_states or [{"queued": "pending"}.get(state, state)] * workers
    return {
        "id": id,
        "name": name,
        "state": state,
        "backend": "local",
        "workers": workers,
        "gpus_per_worker": 0,
        "cpus": 1.0,
        "memory": None,
        "framework": "pytorch",
        "created": created,
        "started": None if state == "queued" else created,
        "finished": None,
        "error": None,
        "failed_rank": None,
        "reason": None,
        "queue_position": None,
        "origin": {},
        "ranks": [
            {
                "rank": r,
                "state": s,
                "exit_code": None,
                "pid": None,
                "host": "localhost",
                "started": None,
                "finished": None,
                "metrics": {
                    "cpu_percent": 40.0 + 10 * r if s == "running" else None,
                    "memory_bytes": 300_000_000 + r * 1_000_000 if s == "running" else None,
                    "gpu_util": None,
                    "gpu_memory_bytes": None,
                },
                "progress": None,
            }
            for r, s in enumerate(ranks)
        ],
        # The rest of the document's required fields, as a plain job has them (a test
        # checks every canned job against the document: test_fake_api_shape.py).
        "image": None,
        "queue": None,
        "priority": 0,
        "tensorboard": None,
        "sync_packages": False,
        "timeout": None,
        "max_restarts": 0,
        "env": {},
        "restarts": 0,
        "owner": None,
        "has_result": False,
        "parent": None,
        "sweep": None,
        "session": None,
        "gpu_idle_since": None,
        "stall_after": None,
        "on_stall": "warn",
        "stall": None,
        "straggler": None,
        "attempts": [],
        "tracking": None,
        **extra,
    }


@dataclass
class FakeApi:
    jobs: dict[str, dict[str, Any]] = field(default_factory=dict)
    cluster: dict[str, Any] = field(
        default_factory=lambda: {
            "backend": "local",
            "capacity": {
                "gpus": {"total": 0, "free": 0},
                "cpus": {"total": 16, "free": 10},
                "memory": {"total": 128 * 2**30, "free": 90 * 2**30},
            },
            "queue": [],
        }
    )
    notebooks: list[dict[str, Any]] | None = None  # None: 503 "no cluster configured"
    sessions: list[dict[str, Any]] = field(default_factory=list)
    logs: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    metrics: dict[str, dict[str, Any]] = field(default_factory=dict)
    requests: list[tuple[str, str]] = field(default_factory=list)
    sockets: list[Any] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def install(self, page) -> None:
        page.route(API, self._handle)
        page.route_web_socket(EVENTS, self._on_socket)

    def take_over(self, other: FakeApi) -> None:
        """Answer from now on with another fake's canned state (the routes stay installed)."""
        with self._lock:
            self.jobs, self.cluster, self.notebooks = other.jobs, other.cluster, other.notebooks
            self.logs, self.metrics = other.logs, other.metrics
            self.requests.clear()

    # -- websocket ---------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        return {"type": "snapshot", "jobs": list(self.jobs.values()), "cluster": self.cluster}

    def _on_socket(self, ws) -> None:
        self.sockets.append(ws)
        ws.send(json.dumps(self.snapshot()))

    def push(self, event: dict[str, Any]) -> None:
        """Send an event to the open socket(s), updating the canned state the same way."""
        if event["type"] == "job":
            self.jobs[event["job"]["id"]] = event["job"]
        elif event["type"] == "deleted":
            self.jobs.pop(event["id"], None)
        for ws in self.sockets:
            ws.send(json.dumps(event))

    def drop_connections(self) -> None:
        """The server goes away: close every socket (the panel must reconnect by itself)."""
        sockets, self.sockets = self.sockets, []
        for ws in sockets:
            ws.close(code=1011, reason="server restarting")

    # -- REST --------------------------------------------------------------------------

    def _handle(self, route) -> None:
        request = route.request
        url = urlparse(request.url)
        path = API_PATH.search(url.path).group(1)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        self.requests.append((request.method, path + (f"?{url.query}" if url.query else "")))
        buster = [p for p in url.query.split("&") if p.isdigit()]
        if buster:
            # As the real API: unknown query parameters are refused, and that includes the
            # bare timestamp ServerConnection appends to GETs under its default cache mode.
            message = f"unknown query parameter(s): {', '.join(buster)}"
            route.fulfill(
                status=400, body=json.dumps({"message": message}), content_type="application/json"
            )
            return
        status, body, content_type = self._answer(request.method, path, query)
        route.fulfill(status=status, body=body, content_type=content_type)

    def _answer(self, method: str, path: str, query: dict[str, str]) -> tuple[int, str, str]:
        as_json = "application/json"
        parts = path.strip("/").split("/")
        if parts == ["cluster"]:
            return 200, json.dumps(self.cluster), as_json
        if parts == ["jobs"] and method == "GET":
            return 200, json.dumps({"jobs": list(self.jobs.values())}), as_json
        if parts[0] == "jobs" and len(parts) >= 2:
            job_id = parts[1]
            if job_id not in self.jobs:
                return 404, json.dumps({"message": f"no job {job_id}"}), as_json
            if len(parts) == 2 and method == "DELETE":
                return 200, json.dumps(self.jobs[job_id]), as_json
            if parts[2:] == ["logs"]:
                return self._logs(job_id, query)
            if parts[2:] == ["metrics"]:
                return (
                    200,
                    json.dumps(self.metrics.get(job_id, {"id": job_id, "ranks": []})),
                    as_json,
                )
        if parts == ["sessions"] and method == "GET":
            return 200, json.dumps({"sessions": self.sessions}), as_json
        if parts[0] == "notebooks":
            if self.notebooks is None:
                message = "No Kubernetes cluster is configured: notebook servers need the kubernetes backend."
                return 503, json.dumps({"message": message}), as_json
            return 200, json.dumps({"notebooks": self.notebooks}), as_json
        return 404, json.dumps({"message": f"no route {method} {path}"}), as_json

    def _logs(self, job_id: str, query: dict[str, str]) -> tuple[int, str, str]:
        lines = self.logs.get(job_id, [])
        start = int(query.get("since", "0:0").split(":")[1] or 0)
        if query.get("follow") == "true":
            body = "".join(json.dumps(line) + "\n" for line in lines[start:])
            return 200, body, "application/x-ndjson"
        page = lines[start : start + 50_000]
        return (
            200,
            json.dumps({"lines": page, "cursor": f"0:{start + len(page)}"}),
            "application/json",
        )


def log_lines(count: int, ranks: int = 2) -> list[dict[str, Any]]:
    return [
        {
            "rank": i % ranks,
            "ts": "2026-11-22T01:00:00.000000Z",
            "stream": "stderr" if i % 997 == 0 else "stdout",
            "line": f"step {i // ranks:>6}  loss {1 / (1 + i / 1000):.5f}  lr 3.0e-04",
        }
        for i in range(count)
    ]
