"""Each caller's share of the extension's executor on a server several users share.

The executor has `MLClusterApp.executor_threads` threads for every request's blocking work.
Most of it is short, but some is not (a stop of a job whose handler takes its grace, a
Kubernetes call retried through an outage). Without a share, one user's slow or repeated
requests could hold every thread and make everyone else's requests wait. `CallerSlots`
lets each caller hold at most `per_caller` threads at once; their further calls wait on the
event loop, holding nothing. Entries live only while their caller has calls in flight.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator


class CallerSlots:
    def __init__(self, per_caller: int):
        self.per_caller = per_caller
        self._slots: dict[str, tuple[asyncio.Semaphore, int]] = {}

    @contextlib.asynccontextmanager
    async def hold(self, caller: str) -> AsyncIterator[None]:
        """One of `caller`'s slots, waited for on the event loop while all are taken."""
        semaphore, calls = self._slots.get(caller, (None, 0))
        if semaphore is None:
            semaphore = asyncio.Semaphore(self.per_caller)
        self._slots[caller] = (semaphore, calls + 1)
        try:
            async with semaphore:
                yield
        finally:
            semaphore, calls = self._slots[caller]
            if calls == 1:
                del self._slots[caller]
            else:
                self._slots[caller] = (semaphore, calls - 1)

    def in_flight(self, caller: str) -> int:
        """Calls of `caller` running or waiting (tests and metrics)."""
        return self._slots.get(caller, (None, 0))[1]
