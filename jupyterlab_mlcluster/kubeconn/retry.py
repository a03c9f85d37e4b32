"""When to try again: the one retry policy for every call and watch (`call`/`call_async`,
`retryable`, `backoff_from_env`), a repeated failure logged once then counted (`FailureLog`),
kopf's `error_backoffs` in the same policy (`BackoffSchedule`) and kopf's per-attempt error
lines limited (`RepeatFilter`)."""

from __future__ import annotations

import dataclasses
import logging
import re
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

from ..jobs.backoff import Backoff, backoff_from_env
from .errors import NO_CLUSTER, ClusterUnavailable, KubeError, _is_transport_error

log = logging.getLogger("jupyterlab_mlcluster.kubernetes")

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class BackoffSchedule:
    """`attempts` waits of a Backoff, drawn anew each time it is iterated: the form kopf's
    `settings.networking.error_backoffs` takes (a sized iterable it walks per request), so
    the controller's own API calls back off like every other caller's."""

    policy: Backoff
    attempts: int

    def __iter__(self) -> Iterator[float]:
        return (self.policy.delay(n) for n in range(self.attempts))

    def __len__(self) -> int:
        return self.attempts


class RepeatFilter(logging.Filter):
    """For log records that others' code emits per attempt (kopf logs every failed request
    of every watch at ERROR): the first of a kind passes, repeats within `every` seconds are
    dropped, and the next to pass says how many were. A kind is the
    message with its numbers taken out (attempt counters, resource versions, ports); only
    the loggers under `prefix` are limited."""

    def __init__(
        self, prefix: str = "", every: float = 60.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        super().__init__()
        self.prefix, self.every, self.clock = prefix, every, clock
        self._shown: dict[tuple[str, str], tuple[float, int]] = {}  # -> last shown, dropped since
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING or not record.name.startswith(self.prefix):
            return True
        kind = (record.name, _DIGITS.sub("#", record.getMessage()))
        now = self.clock()
        with self._lock:
            if len(self._shown) > 1000:  # bounded: kinds of a long-gone outage are forgotten
                self._shown = {k: v for k, v in self._shown.items() if now - v[0] < self.every}
            shown, dropped = self._shown.get(kind, (-float("inf"), 0))
            if now - shown < self.every:
                self._shown[kind] = (shown, dropped + 1)
                return False
            self._shown[kind] = (now, 0)
        if dropped:
            record.msg = f"{record.getMessage()} (and {dropped} more like it in {now - shown:.0f}s)"
            record.args = None
        return True


_DIGITS = re.compile(r"\d+")


def retryable(exc: BaseException) -> bool:
    """Worth trying again: unreachable, throttled (429), a server error (5xx), or a write
    conflict (409 Conflict: the caller re-reads). Never AlreadyExists or other client
    errors: the same request would fail the same way."""
    if isinstance(exc, ClusterUnavailable):
        return not str(exc).startswith(NO_CLUSTER)
    if isinstance(exc, KubeError):
        status = exc.status
        if status is None:
            return True
        if status == 409:
            return exc.reason != "AlreadyExists"
        return status == 429 or status >= 500
    return _is_transport_error(exc)


class FailureLog:
    """Logs a repeated failure once, then a count now and then ("... (x37 in 60s)"), so an
    outage costs a few lines, not a traceback per attempt."""

    def __init__(
        self,
        logger: logging.Logger,
        every: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.logger = logger
        self.every = every
        self.clock = clock
        self._first: dict[str, float] = {}
        self._last: dict[str, float] = {}
        self._count: dict[str, int] = {}
        self._lock = threading.Lock()

    def failed(self, what: str, exc: BaseException, level: int = logging.WARNING) -> None:
        now = self.clock()
        key = f"{what}: {exc}"
        with self._lock:
            count = self._count[key] = self._count.get(key, 0) + 1
            if key not in self._last:
                self._first[key] = self._last[key] = now
            elif now - self._last[key] >= self.every:
                self._last[key] = now
            else:
                return
            since = now - self._first[key]
        if count == 1:
            self.logger.log(level, "%s", key)
        else:
            self.logger.log(level, "%s (x%d in %.0fs)", key, count, since)

    def recovered(self, what: str) -> None:
        """The failures of `what` are over: the next one is logged at once again."""
        with self._lock:
            keys = [k for k in self._count if k.startswith(f"{what}: ")]
            over = [(k, self._count[k]) for k in keys]
            for key in keys:
                for table in (self._first, self._last, self._count):
                    table.pop(key, None)
        for key, count in over:
            if count > 1:
                self.logger.info("%s (x%d, over)", key, count)


CALL_FAILURES = FailureLog(log)  # retried calls without a log of their own


class _Retries:
    """The retry decision `call` and `call_async` share: after a failure, how long to wait
    before the next attempt, or re-raise (not retryable, or past `give_up_after`)."""

    def __init__(self, what, policy, give_up_after, failures, on_retry) -> None:
        self.what, self.give_up_after = what, give_up_after
        self.policy = policy or backoff_from_env()
        self.failures, self.on_retry = failures, on_retry
        self.started = time.monotonic()

    def wait_after(self, exc: Exception, attempt: int) -> float:
        if not retryable(exc):
            raise exc
        wait = self.policy.delay(attempt, getattr(exc, "retry_after", None))
        elapsed = time.monotonic() + wait - self.started
        if self.give_up_after is not None and elapsed > self.give_up_after:
            raise exc
        (self.failures or CALL_FAILURES).failed(self.what, exc, logging.INFO)
        if self.on_retry is not None:
            self.on_retry(exc)
        return wait

    def succeeded(self, attempt: int) -> None:
        if self.failures is not None and attempt:
            self.failures.recovered(self.what)


def call(
    action: Callable[[], T],
    what: str,
    *,
    policy: Backoff | None = None,
    give_up_after: float | None = 120.0,
    sleep: Callable[[float], Any] = time.sleep,
    failures: FailureLog | None = None,
    on_retry: Callable[[BaseException], Any] | None = None,
) -> T:
    """Run `action` (which must re-read what it depends on) until it succeeds, retrying
    what `retryable` allows with `policy`; after `give_up_after` seconds (None: never) the
    last failure is raised. `sleep` may raise to stop waiting (a supervisor told to exit).
    `on_retry(exc)` is told of each failure about to be retried (the controller counts them)."""
    retries = _Retries(what, policy, give_up_after, failures, on_retry)
    attempt = 0
    while True:
        try:
            result = action()
        except Exception as exc:  # noqa: BLE001 - wait_after re-raises what is not retried
            sleep(retries.wait_after(exc, attempt))
            attempt += 1
            continue
        retries.succeeded(attempt)
        return result


async def call_async(
    action: Callable[[], Awaitable[T]],
    what: str,
    *,
    policy: Backoff | None = None,
    give_up_after: float | None = 120.0,
    failures: FailureLog | None = None,
    on_retry: Callable[[BaseException], Any] | None = None,
) -> T:
    """`call` for coroutines (the controller)."""
    import asyncio

    retries = _Retries(what, policy, give_up_after, failures, on_retry)
    attempt = 0
    while True:
        try:
            result = await action()
        except Exception as exc:  # noqa: BLE001 - wait_after re-raises what is not retried
            await asyncio.sleep(retries.wait_after(exc, attempt))
            attempt += 1
            continue
        retries.succeeded(attempt)
        return result
