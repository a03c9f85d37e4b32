"""The package's one retry policy: how long to wait after the n-th failure in a row.

Every loop that retries something that failed (the Kubernetes calls and watches in
kubeconn, a supervisor writing its job's end to a full disk, the schedulers' passes, the
Kueue and Volcano views) draws its waits here, so they all back off the same way: the
ceiling doubles from `first` up to `cap`, and the wait is a uniform random time below it.
Random, so that many clients failing together (an API server restart, a shared disk that
filled up) do not come back in step; capped, so that recovery is noticed within `cap`.

`backoff_from_env` is the policy as the environment scales it (tests shorten it).

It lives in jobs/, the engine layer, because jobs/ may not import kubeconn (nor backends/
or server/); kubeconn re-exports it.
"""

from __future__ import annotations

import dataclasses
import os
import random


@dataclasses.dataclass(frozen=True)
class Backoff:
    """Exponential backoff with jitter, capped: attempt n (0 for the first retry) waits a
    uniform random time in [floor * c, c], c = min(cap, first * 2**n), and never less than
    a server's `Retry-After` (itself capped: a server's wish does not outlast our cap).

    `floor` 0 is full jitter (spreads many clients the most; a wait may be near zero);
    0.5 is "equal jitter": never sooner than half the ceiling, for loops that must not
    retry at once (a failing pass would otherwise spin) or sooner than their normal poll."""

    first: float = 0.5
    cap: float = 60.0
    floor: float = 0.0

    def ceiling(self, attempt: int) -> float:
        """The longest wait of attempt `attempt` (the exponent is clipped: 2**62 already
        exceeds any cap, and a float power of a huge attempt would overflow)."""
        return min(self.cap, self.first * 2 ** min(max(attempt, 0), 62))

    def delay(
        self, attempt: int, retry_after: float | None = None, rng: random.Random | None = None
    ) -> float:
        """A wait for attempt `attempt`; `rng` for a caller's own (seeded) generator."""
        ceiling = self.ceiling(attempt)
        uniform = rng.uniform if rng is not None else random.uniform
        wait = uniform(self.floor * ceiling, ceiling)
        if retry_after is not None:
            wait = max(wait, min(retry_after, self.cap))
        return wait


def backoff_from_env() -> Backoff:
    """The policy; `MLCLUSTER_KUBE_BACKOFF=first,cap` (seconds) changes its scale (tests)."""
    value = os.environ.get("MLCLUSTER_KUBE_BACKOFF", "")
    try:
        first, cap = (float(v) for v in value.split(","))
    except ValueError:
        return Backoff()
    return Backoff(first=max(first, 0.001), cap=max(cap, first))
