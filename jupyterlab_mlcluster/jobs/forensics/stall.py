"""The stall rule (pure): a rank that for `after` seconds has not printed, not reported
progress and used no CPU (under STALL_CPU_PERCENT in each sample) is stalled.

Its cost is a clock read and a dict write per output line or CPU sample the supervisor
already handles, and one pass over the ranks per check: nothing a running job would notice.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

# A rank blocked in a collective, in I/O or on a lock reads 0.0; anything at or above this
# (a rank computing, a background thread at work) is activity.
STALL_CPU_PERCENT = 1.0


class StallWatch:
    def __init__(
        self,
        after: float,
        cpu_percent: float = STALL_CPU_PERCENT,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.after = max(0.0, float(after or 0.0))
        self.cpu_percent = cpu_percent
        self.clock = clock
        self.last_active: dict[int, float] = {}
        self.flagged: tuple[int, ...] = ()
        self.cpu_seen: set[int] = set()  # ranks with a CPU figure (where none: say so)

    @property
    def enabled(self) -> bool:
        return self.after > 0

    def active(self, rank: int, now: float | None = None) -> None:
        """The rank printed, reported progress or started."""
        self.last_active[rank] = self.clock() if now is None else now

    def cpu(self, rank: int, percent: float | None, now: float | None = None) -> None:
        if percent is not None:
            self.cpu_seen.add(rank)
        if percent is not None and percent >= self.cpu_percent:
            self.active(rank, now)

    def stalled(self, live: Iterable[int], now: float | None = None) -> dict[int, float]:
        """rank -> since when (this watch's clock) of the live ranks stalled now."""
        if not self.enabled:
            return {}
        now = self.clock() if now is None else now
        out = {}
        for rank in live:
            since = self.last_active.setdefault(rank, now)
            if now - since >= self.after:
                out[rank] = since
        return out

    def check(self, live: Iterable[int], now: float | None = None) -> dict[int, float] | None:
        """The stalled ranks when the set changed since the last check (an empty dict: no
        rank is stalled any more), else None."""
        stalled = self.stalled(live, now)
        ranks = tuple(sorted(stalled))
        if ranks == self.flagged:
            return None
        self.flagged = ranks
        return stalled
