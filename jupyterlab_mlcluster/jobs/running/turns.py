"""Threads started in turns: a fleet's jobs coming up a few at a time (fleet.py).

A new fleet may take a thousand jobs on its first look (a dead fleet's). Started at once,
their threads shared the GIL a thousand ways, and a running job was followed again only when
all of them were. Started in turns, `at_once` of them come up at a time: from a thread's
start until it says it is up (its loop's first long wait, when its news has calmed down). One
slower than `turn_limit` (waiting for an API that went away, say) no longer counts.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Hashable

ADOPTING_AT_ONCE = 32
ADOPTING_TURN_LIMIT = 5.0


class StartInTurns:
    """Threads queued (`put`) and started in order by one starter thread (`run_starter`)."""

    def __init__(self, at_once: int = ADOPTING_AT_ONCE, turn_limit: float = ADOPTING_TURN_LIMIT):
        self.at_once = at_once
        self.turn_limit = turn_limit
        self._waiting: queue.Queue[tuple[threading.Thread, Hashable]] = queue.Queue()
        self._coming_up: dict[Hashable, float] = {}  # whose turn it is, since when
        self._turns = threading.Condition()

    def run_starter(self) -> None:
        """The starter, in a daemon thread of its own."""
        threading.Thread(target=self._start_in_turn, name="start-in-turns", daemon=True).start()

    def put(self, thread: threading.Thread, key: Hashable) -> None:
        """Start `thread` in its turn; `up(key)` ends that turn."""
        self._waiting.put((thread, key))

    def up(self, key: Hashable) -> None:
        with self._turns:
            if self._coming_up.pop(key, None) is not None:
                self._turns.notify()

    def _start_in_turn(self) -> None:
        while True:
            thread, key = self._waiting.get()
            with self._turns:
                while True:
                    now = time.monotonic()
                    for slow, since in list(self._coming_up.items()):
                        if now - since >= self.turn_limit:
                            del self._coming_up[slow]
                    if len(self._coming_up) < self.at_once:
                        break
                    self._turns.wait(min(self._coming_up.values()) + self.turn_limit - now)
                self._coming_up[key] = now
            thread.start()
