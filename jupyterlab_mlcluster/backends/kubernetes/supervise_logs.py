"""A Kubernetes attempt's pod log streams, inside its supervisor (supervise.py's `_Attempt`):
one stream per pod of the attempt (read by the process's one event loop, log_loop.py;
re-opened with LOG_BACKOFF when it ends early, skipping the lines already stored), each
pod's bytes split by its `PodOutput` into the ranks' lines and signed records, handed to the
attempt as they come."""

from __future__ import annotations

import queue
import time
from collections.abc import Callable, Collection, Mapping
from typing import Any

from ... import kubeconn
from .client import Connection, message_of
from .log_loop import LogStream, follow_log
from .logs import PodOutput
from .objects import pod_ranks
from .status import container_phase

LOOP_TICK = 0.05
LOG_DRAIN_TIMEOUT = 10.0  # after the outcome: how long to wait for the last log lines
# Before re-opening a log stream that ended early or failed: the one policy, with a lower cap
# so that lines written during an outage are read before the drain after the outcome ends.
LOG_BACKOFF = kubeconn.Backoff(first=kubeconn.backoff_from_env().first, cap=10.0)
LOG_FAILURES_REPORTED = 3  # failures in a row before the user hears of it

Pods = Mapping[str, dict[str, Any]]


class LogStreams:
    """The log streams of one attempt's pods. Each stream puts ("log", pod, bytes) and
    ("log_end", pod, error) into `events` (the attempt's queue; its loop hands them back
    to `fed` and `ended`); each pod's ranks' items go to `deliver(rank, kind, value)`;
    `say(text)` is a line in the job's log."""

    def __init__(
        self,
        conn: Connection,
        namespace: str,
        container: str,
        placement: tuple[str, int],  # (engine, ranks per pod): which ranks a pod holds
        key: bytes,
        events: queue.Queue[tuple[Any, ...]],
        deliver: Callable[[int, str, Any], None],
        say: Callable[[str], None],
    ):
        self.conn, self.namespace, self.container = conn, namespace, container
        self.engine, self.ranks_per_pod = placement
        self.key, self.events, self.deliver, self.say = key, events, deliver, say
        self.outputs: dict[str, PodOutput] = {}
        self.followers: dict[str, LogStream] = {}
        self.done: set[str] = set()  # pods whose log was read to its end
        self.retry_at: dict[str, float] = {}  # pod -> when its stream may open again
        self.failures: dict[str, int] = {}  # pod -> its stream's failures in a row
        self.resume_skip: dict[str, dict[int, int]] = {}  # pod -> rank -> lines stored
        # Lines each rank had stored when this supervisor adopted the attempt.
        self.adopted_skip: dict[int, int] = {}

    def ensure(self, pods: Pods) -> None:
        """Follow the log of each of the attempt's `pods` whose container started, unless
        it is followed, read to its end, or waiting to be opened again."""
        now = time.monotonic()
        for name, pod in pods.items():
            if name in self.followers or name in self.done:
                continue
            if self.retry_at.get(name, 0.0) > now:
                continue
            if container_phase(pod, self.container) == "waiting":
                continue
            ranks = pod_ranks(pod, self.engine, self.ranks_per_pod)
            if not ranks:
                continue
            skip = self.resume_skip.pop(name, None)
            if skip is None:
                skip = {r: self.adopted_skip.get(r, 0) for r in ranks}
            self.outputs[name] = PodOutput(ranks, skip, key=self.key)
            self.followers[name] = follow_log(
                self.conn, self.namespace, name, self.container, self.events
            )

    def fed(self, pod_name: str, data: bytes) -> None:
        """Bytes of a pod's log."""
        self.failures.pop(pod_name, None)  # it streams again
        output = self.outputs.get(pod_name)
        if output is not None:
            for rank, kind, value in output.feed(data):
                self.deliver(rank, kind, value)

    def ended(self, pod_name: str, error: BaseException | None, pod: dict[str, Any] | None) -> None:
        """A pod's stream ended (`pod`: what the watches last said of it, None if gone)."""
        self.followers.pop(pod_name, None)
        output = self.outputs.pop(pod_name, None)
        if output is None:
            return
        for rank, kind, value in output.finish():
            self.deliver(rank, kind, value)
        if pod is None or (error is None and container_phase(pod, self.container) == "terminated"):
            self.done.add(pod_name)
            return
        # Ended early (a dropped connection, or our view of the pod is behind): read it
        # again later, skipping what we already have.
        self.resume_skip[pod_name] = output.seen()
        failures = self.failures[pod_name] = self.failures.get(pod_name, 0) + (error is not None)
        if failures == LOG_FAILURES_REPORTED and error is not None:
            self.say(f"[mlcluster] cannot read the log of pod {pod_name}: {message_of(error)}")
        delay = LOG_BACKOFF.delay(failures, getattr(error, "retry_after", None))
        self.retry_at[pod_name] = time.monotonic() + delay

    def unread(self, wanted: Collection[str], pods: Pods) -> set[str]:
        """The `wanted` pods whose log is still to be read to its end (one that never
        started has no log to wait for)."""
        return {
            n
            for n in wanted
            if n in self.followers
            or (
                n not in self.done
                and n in pods
                and container_phase(pods[n], self.container) != "waiting"
            )
        }

    def stop(self) -> None:
        for follower in list(self.followers.values()):
            follower.stop()
