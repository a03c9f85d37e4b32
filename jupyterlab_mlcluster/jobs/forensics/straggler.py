"""The straggler rule (pure): a rank whose step rate over the last `after` seconds is under
the median of its peers' divided by `factor` (1.5) is a straggler, once every one of them
has reported progress (`mlc.progress`, tqdm) for that long.

A rate is the steps a rank advanced over the window, divided by the window: a rank that
stopped reporting reads 0 (its peers go on), a rank that never reported is not counted (it
is the stall watch's, or has no progress bar). A step that goes back (a new bar, a restart)
starts that rank's history again. Every backend feeds it: the supervisor sees each progress
report it stores (`JobContext.set_ranks`), so it is the same rule on every backend.
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from collections.abc import Callable

STRAGGLER_FACTOR = 1.5
STRAGGLER_AFTER = 30.0


class StragglerWatch:
    def __init__(
        self,
        after: float = STRAGGLER_AFTER,
        factor: float = STRAGGLER_FACTOR,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.after = max(0.0, float(after or 0.0))
        self.factor = factor
        self.clock = clock
        # rank -> (when, step) samples, oldest first: one before the window, then those in it.
        self.history: dict[int, deque[tuple[float, float]]] = {}
        self.flagged: tuple[int, ...] = ()

    @property
    def enabled(self) -> bool:
        return self.after > 0

    def step(self, rank: int, step: float, now: float | None = None) -> None:
        """The rank reported it is at `step`."""
        if not self.enabled:
            return
        now = self.clock() if now is None else now
        samples = self.history.setdefault(rank, deque())
        if samples and step < samples[-1][1]:
            samples.clear()
        samples.append((now, step))
        # Keep one sample at or before the window's start: the rate's base.
        while len(samples) > 2 and samples[1][0] <= now - self.after:
            samples.popleft()

    def forget(self, rank: int) -> None:
        """The rank ended: it is no one's peer any more."""
        self.history.pop(rank, None)

    def rates(self, now: float | None = None) -> dict[int, float]:
        """Steps per second over the last `after` seconds, of the ranks reporting that long
        (empty until every reporting rank has)."""
        if not self.enabled:
            return {}
        now = self.clock() if now is None else now
        start = now - self.after
        out = {}
        for rank, samples in self.history.items():
            if not samples or samples[0][0] > start:
                return {}  # a rank has not reported for a whole window yet: no verdict
            base = samples[0][1]
            for when, step in samples:
                if when <= start:
                    base = step
            out[rank] = (samples[-1][1] - base) / self.after
        return out

    def stragglers(self, now: float | None = None) -> tuple[dict[int, float], float]:
        """rank -> its rate, of the stragglers now; and the median rate of all ranks."""
        rates = self.rates(now)
        if len(rates) < 2:
            return {}, 0.0
        out = {}
        for rank, rate in rates.items():
            peers = statistics.median(r for k, r in rates.items() if k != rank)
            if peers > 0 and rate * self.factor < peers:
                out[rank] = rate
        return out, statistics.median(rates.values())

    def check(self, now: float | None = None) -> tuple[dict[int, float], float] | None:
        """The stragglers and the median rate when the set changed since the last check
        (an empty dict: none any more), else None."""
        slow, median = self.stragglers(now)
        ranks = tuple(sorted(slow))
        if ranks == self.flagged:
            return None
        self.flagged = ranks
        return slow, median
