"""Container logs of emulated pods: what a kubelet would hold, served by ``pods/{name}/log``.

Tests append text through the fixture helper (a real cluster has no API to write logs). The
logs disappear with their pod, as they do on a real node once the pod is deleted.
"""
from __future__ import annotations

import asyncio
import collections
import datetime
from dataclasses import dataclass
from typing import Any

LogKey = tuple[str, str, str]  # namespace, pod, container


@dataclass(frozen=True)
class LogLine:
    time: datetime.datetime
    text: str  # one line, with its trailing newline


def rfc3339_nano(moment: datetime.datetime) -> str:
    return moment.astimezone(datetime.timezone.utc).strftime('%Y-%m-%dT%H:%M:%S.%f000Z')


def parse_time(text: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(text.replace('Z', '+00:00'))


@dataclass(frozen=True)
class LogQuery:
    """The pod log options the emulator honours (PodLogOptions)."""
    timestamps: bool = False
    since_time: datetime.datetime | None = None
    tail_lines: int | None = None
    limit_bytes: int | None = None

    @classmethod
    def from_params(cls, params: dict[str, str]) -> 'LogQuery':
        since = None
        if params.get('sinceTime'):
            since = parse_time(params['sinceTime'])
        elif params.get('sinceSeconds'):
            since = (datetime.datetime.now(datetime.timezone.utc)
                     - datetime.timedelta(seconds=int(params['sinceSeconds'])))
        return cls(timestamps=params.get('timestamps') == 'true', since_time=since,
                   tail_lines=int(params['tailLines']) if params.get('tailLines') else None,
                   limit_bytes=int(params['limitBytes']) if params.get('limitBytes') else None)

    def render(self, lines: list[LogLine]) -> str:
        if self.since_time is not None:
            lines = [line for line in lines if line.time >= self.since_time]
        if self.tail_lines is not None:
            lines = lines[-self.tail_lines:] if self.tail_lines else []
        text = ''.join(f'{rfc3339_nano(l.time)} {l.text}' if self.timestamps else l.text
                       for l in lines)
        return text[:self.limit_bytes] if self.limit_bytes is not None else text


class PodLogs:
    def __init__(self) -> None:
        self._lines: dict[LogKey, list[LogLine]] = collections.defaultdict(list)
        self._partial: dict[LogKey, str] = {}
        self.changed = asyncio.Condition()

    def lines(self, key: LogKey) -> list[LogLine]:
        return list(self._lines.get(key, ()))

    async def append(self, key: LogKey, text: str, when: datetime.datetime | None = None) -> None:
        moment = when or datetime.datetime.now(datetime.timezone.utc)
        text = self._partial.pop(key, '') + text
        *complete, rest = text.split('\n')
        self._lines[key].extend(LogLine(moment, line + '\n') for line in complete)
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
    for status in (pod.get('status') or {}).get('containerStatuses') or []:
        if status.get('name') == container:
            state = status.get('state') or {}
            for name in ('terminated', 'running', 'waiting'):
                if name in state:
                    return name
    phase = (pod.get('status') or {}).get('phase', 'Pending')
    return {'Pending': 'waiting', 'Running': 'running'}.get(phase, 'terminated')
