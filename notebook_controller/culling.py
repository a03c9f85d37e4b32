"""Idle detection from the notebook server's own activity endpoints.

Kubeflow culls on kernel activity alone, so a long job in a terminal, or a user typing in an
open tab, gets culled. Here a notebook is active when any of these says so:

- a kernel is executing (``/api/kernels``: ``execution_state == 'busy'``);
- the server's last activity (``/api/status``: kernels, terminals, API use by the user) or any
  kernel's or terminal's ``last_activity`` is recent;
- a client is connected (``/api/status``: ``connections``), unless ``cull_connected``.

The probes pass ``no_track_activity=1`` so that reading activity is not itself activity.

The pod answering is the user's: it may redirect (the controller's identity would then call
wherever it points) or stream without end. Redirects are not followed, and a body longer than
`MAX_BODY` bytes is refused unread beyond that; either is a failed probe, never a cull.
"""

from __future__ import annotations

import asyncio
import datetime
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

MAX_BODY = 64 * 1024  # a busy server's /api/kernels with hundreds of kernels fits in a few KiB


@dataclass(frozen=True)
class Activity:
    last_activity: datetime.datetime
    busy: bool
    connections: int
    kernels: int
    terminals: int


def _parse(value: Any) -> datetime.datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        moment = datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=datetime.UTC)


def judge_activity(
    status: Mapping[str, Any],
    kernels: Sequence[Mapping[str, Any]],
    terminals: Sequence[Mapping[str, Any]],
) -> Activity:
    moments = [_parse(status.get("last_activity")), _parse(status.get("started"))]
    moments += [_parse(k.get("last_activity")) for k in kernels]
    moments += [_parse(t.get("last_activity")) for t in terminals]
    known = [m for m in moments if m is not None]
    last = max(known) if known else datetime.datetime.now(datetime.UTC)
    connections = int(
        status.get("connections") or sum(int(k.get("connections") or 0) for k in kernels)
    )
    return Activity(
        last_activity=last,
        busy=any(k.get("execution_state") == "busy" for k in kernels),
        connections=connections,
        kernels=len(kernels),
        terminals=len(terminals),
    )


def should_cull(
    activity: Activity, now: datetime.datetime, idle_time: float, cull_connected: bool
) -> bool:
    if activity.busy or (activity.connections and not cull_connected):
        return False
    return (now - activity.last_activity).total_seconds() >= idle_time


class ProbeError(Exception):
    """The notebook's activity endpoints could not be read (never a reason to cull)."""


async def _get_json(session: aiohttp.ClientSession, url: str, timeout: float) -> Any:
    async with session.get(
        url,
        params={"no_track_activity": "1"},
        timeout=aiohttp.ClientTimeout(total=timeout),
        allow_redirects=False,
    ) as response:
        if response.status == 404:
            return None  # e.g. terminals disabled on that server
        if response.status >= 300:
            raise ProbeError(f"{url} answered {response.status} (redirects are not followed)")
        if (response.content_length or 0) > MAX_BODY:
            raise ProbeError(
                f"{url} announced {response.content_length} bytes (at most {MAX_BODY})"
            )
        body = bytearray()
        async for chunk in response.content.iter_chunked(16 * 1024):
            body += chunk
            if len(body) > MAX_BODY:  # streamed without a length: stop reading
                raise ProbeError(f"{url} answered more than {MAX_BODY} bytes")
        return json.loads(bytes(body))


async def probe_activity(session: aiohttp.ClientSession, base_url: str, timeout: float) -> Activity:
    """Read a notebook server's activity from ``<base_url>api/status|kernels|terminals``."""
    base = base_url if base_url.endswith("/") else base_url + "/"
    try:
        status, kernels, terminals = await asyncio.gather(
            _get_json(session, base + "api/status", timeout),
            _get_json(session, base + "api/kernels", timeout),
            _get_json(session, base + "api/terminals", timeout),
        )
    except (TimeoutError, aiohttp.ClientError, ValueError) as exc:
        raise ProbeError(f"cannot read activity at {base}: {exc!r}") from exc
    if not isinstance(status, dict):
        raise ProbeError(f"{base}api/status did not answer with a status")
    return judge_activity(status, kernels or [], terminals or [])
