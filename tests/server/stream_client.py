"""A client in its own process (like a browser): follows a job's logs and /events until
the job ends, then prints a JSON summary. Used to load a server without sharing its GIL.

    python stream_client.py BASE_URL TOKEN JOB_ID
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Callable

from tornado.httpclient import AsyncHTTPClient, HTTPRequest
from tornado.websocket import websocket_connect


async def follow_logs(
    base_url: str,
    headers: dict[str, str],
    job_id: str,
    on_chunk: Callable[[bytes], None],
    timeout: float = 300,
) -> None:
    """GET a job's logs with follow=true, each chunk to `on_chunk`, until the job ends."""
    request = HTTPRequest(
        f"{base_url}/mlcluster/api/jobs/{job_id}/logs?follow=true",
        headers=headers,
        streaming_callback=on_chunk,
        request_timeout=timeout,
    )
    await AsyncHTTPClient(max_body_size=2**34).fetch(request)


async def main(base_url: str, token: str, job_id: str) -> dict:
    headers = {"Authorization": f"token {token}"}
    chunks: list[bytes] = []
    first_chunk: list[float] = []

    def on_chunk(chunk: bytes) -> None:
        if not first_chunk:
            first_chunk.append(time.time())
        chunks.append(chunk)

    messages: list[dict] = []

    async def events() -> None:
        ws_url = base_url.replace("http://", "ws://") + "/mlcluster/api/events"
        ws = await websocket_connect(HTTPRequest(ws_url, headers=headers))
        while True:
            text = await ws.read_message()
            if text is None:
                return
            message = json.loads(text)
            messages.append(message)
            job = message.get("job") or {}
            if (
                message["type"] == "job"
                and job.get("id") == job_id
                and job["state"] in ("succeeded", "failed", "cancelled")
            ):
                ws.close()
                return

    await asyncio.gather(follow_logs(base_url, headers, job_id, on_chunk), events())
    data = b"".join(chunks)
    stdout: dict[int, list[str]] = {}
    for raw in data.splitlines():
        line = json.loads(raw)
        if line["stream"] == "stdout":
            stdout.setdefault(line["rank"], []).append(line["line"])
    return {
        "bytes": len(data),
        "stdout": {rank: len(texts) for rank, texts in stdout.items()},
        "last": {rank: texts[-1] for rank, texts in stdout.items()},
        "in_order": {
            rank: all(t.endswith(f" {i}") for i, t in enumerate(texts))
            for rank, texts in stdout.items()
        },
        "ws_messages": len(messages),
        "first_chunk": first_chunk[0] if first_chunk else None,
    }


if __name__ == "__main__":
    summary = asyncio.run(main(*sys.argv[1:4]))
    json.dump(summary, sys.stdout)
