"""Container logs of emulated pods: what a kubelet would hold, served by ``pods/{name}/log``.

Tests append text through the fixture helper (a real cluster has no API to write logs). The
logs disappear with their pod, as they do on a real node once the pod is deleted.
"""

from __future__ import annotations

import asyncio
import collections
import datetime
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import aiohttp.web

from .catalogue import PODS, ResourceType
from .protocol import bad_request
from .store import Store

LogKey = tuple[str, str, str]  # namespace, pod, container


@dataclass(frozen=True)
class LogLine:
    time: datetime.datetime
    text: str  # one line, with its trailing newline


def rfc3339_nano(moment: datetime.datetime) -> str:
    return moment.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%f000Z")


def parse_time(text: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))


@dataclass(frozen=True)
class LogQuery:
    """The pod log options the emulator honours (PodLogOptions)."""

    timestamps: bool = False
    since_time: datetime.datetime | None = None
    tail_lines: int | None = None
    limit_bytes: int | None = None

    @classmethod
    def from_params(cls, params: dict[str, str]) -> LogQuery:
        since = None
        if params.get("sinceTime"):
            since = parse_time(params["sinceTime"])
        elif params.get("sinceSeconds"):
            since = datetime.datetime.now(datetime.UTC) - datetime.timedelta(
                seconds=int(params["sinceSeconds"])
            )
        return cls(
            timestamps=params.get("timestamps") == "true",
            since_time=since,
            tail_lines=int(params["tailLines"]) if params.get("tailLines") else None,
            limit_bytes=int(params["limitBytes"]) if params.get("limitBytes") else None,
        )

    def render(self, lines: list[LogLine]) -> str:
        if self.since_time is not None:
            lines = [line for line in lines if line.time >= self.since_time]
        if self.tail_lines is not None:
            lines = lines[-self.tail_lines :] if self.tail_lines else []
        text = "".join(
            f"{rfc3339_nano(line.time)} {line.text}" if self.timestamps else line.text
            for line in lines
        )
        return text[: self.limit_bytes] if self.limit_bytes is not None else text


class PodLogs:
    def __init__(self) -> None:
        self._lines: dict[LogKey, list[LogLine]] = collections.defaultdict(list)
        self._partial: dict[LogKey, str] = {}
        self.changed = asyncio.Condition()

    def lines(self, key: LogKey) -> list[LogLine]:
        return list(self._lines.get(key, ()))

    async def append(self, key: LogKey, text: str, when: datetime.datetime | None = None) -> None:
        moment = when or datetime.datetime.now(datetime.UTC)
        text = self._partial.pop(key, "") + text
        *complete, rest = text.split("\n")
        self._lines[key].extend(LogLine(moment, line + "\n") for line in complete)
        if rest:
            self._partial[key] = rest
        await self.notify()

    async def forget_pod(self, namespace: str, pod: str) -> None:
        for key in [k for k in self._lines if k[:2] == (namespace, pod)]:
            del self._lines[key]
        await self.notify()

    async def notify(self) -> None:
        async with self.changed:
            self.changed.notify_all()


def container_state(pod: dict[str, Any], container: str) -> str:
    """'waiting', 'running' or 'terminated', from containerStatuses or the pod phase."""
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if status.get("name") == container:
            state = status.get("state") or {}
            for name in ("terminated", "running", "waiting"):
                if name in state:
                    return name
    phase = (pod.get("status") or {}).get("phase", "Pending")
    return {"Pending": "waiting", "Running": "running"}.get(phase, "terminated")


class PodLogEndpoint:
    """``GET pods/{name}/log`` of RealisticKubernetes, and the helper that writes log text."""

    _store: Store
    _logs: PodLogs | None
    _closing: bool

    if TYPE_CHECKING:  # provided by the other parts of RealisticKubernetes

        def _require(self, rtype: ResourceType, ns: str | None, name: str) -> dict[str, Any]: ...

    async def _pod_log(
        self,
        raw: aiohttp.web.BaseRequest,
        rtype: ResourceType,
        ns: str,
        name: str,
        params: Mapping[str, str],
    ) -> aiohttp.web.StreamResponse:
        pod = self._require(rtype, ns, name)
        container = self._log_container(pod, params.get("container"))
        if container_state(pod, container) == "waiting":
            raise bad_request(
                f'container "{container}" in pod "{name}" is waiting to start: ContainerCreating'
            )
        try:
            query = LogQuery.from_params(dict(params))
        except ValueError as exc:
            raise bad_request(f"invalid log options: {exc}") from None
        assert self._logs is not None
        key = (ns, name, container)
        if params.get("follow") not in ("true", "1"):
            return aiohttp.web.Response(
                status=200, text=query.render(self._logs.lines(key)), content_type="text/plain"
            )
        response = aiohttp.web.StreamResponse(status=200)
        response.content_type = "text/plain"
        try:
            await response.prepare(raw)
            sent = 0
            while not self._closing:
                lines = self._logs.lines(key)
                if sent == 0 and query.tail_lines is not None:
                    sent = max(0, len(lines) - query.tail_lines)
                    query = LogQuery(query.timestamps, query.since_time, None, None)
                if len(lines) > sent:
                    await response.write(query.render(lines[sent:]).encode())
                    sent = len(lines)
                current = self._store.get(PODS, (ns, name))
                if current is None or container_state(current, container) == "terminated":
                    break
                if raw.transport is None or raw.transport.is_closing():
                    return response
                async with self._logs.changed:
                    try:
                        await asyncio.wait_for(self._logs.changed.wait(), timeout=1.0)
                    except TimeoutError:
                        pass
            await response.write_eof()
        except (ConnectionError, RuntimeError):
            pass
        return response

    @staticmethod
    def _log_container(pod: Mapping[str, Any], requested: str | None) -> str:
        name = pod["metadata"]["name"]
        containers = [c["name"] for c in pod.get("spec", {}).get("containers", [])]
        if requested is None:
            if len(containers) != 1:
                raise bad_request(
                    f"a container name must be specified for pod {name}, choose one "
                    f"of: [{' '.join(containers)}]"
                )
            return containers[0]
        if requested not in containers + [
            c["name"] for c in pod.get("spec", {}).get("initContainers", [])
        ]:
            raise bad_request(f"container {requested} is not valid for pod {name}")
        return requested

    async def append_log(
        self,
        namespace: str,
        pod: str,
        text: str,
        container: str | None = None,
        when: datetime.datetime | None = None,
    ) -> None:
        obj = self._store.get(PODS, (namespace, pod))
        if obj is None:
            raise KeyError(f"no pod {namespace}/{pod}")
        assert self._logs is not None
        await self._logs.append((namespace, pod, self._log_container(obj, container)), text, when)
