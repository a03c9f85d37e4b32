"""A lock per Notebook, kept only while it is held or waited for.

At 10,000 Notebooks a lock kept for each (an asyncio.Lock is some 500 bytes) was memory
for nothing between reconciles; a lock dropped while held (a deleted Notebook forgotten
by the resync) would have let a second holder in."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Hashable


class KeyedLocks:
    """`hold(key)`: one holder at a time per key, the others waiting in turn. For one event
    loop's coroutines (no thread touches it)."""

    def __init__(self) -> None:
        self._held: dict[Hashable, tuple[asyncio.Lock, list[int]]] = {}

    def __len__(self) -> int:
        """Keys held or waited for now."""
        return len(self._held)

    @contextlib.asynccontextmanager
    async def hold(self, key: Hashable) -> AsyncIterator[None]:
        held = self._held.get(key)
        if held is None:  # (not setdefault: that makes a lock on every call)
            held = self._held[key] = (asyncio.Lock(), [0])
        lock, users = held
        users[0] += 1
        try:
            async with lock:
                yield
        finally:
            users[0] -= 1
            if not users[0]:
                del self._held[key]
