"""Idle GPUs: a running job whose GPUs have all stayed under a utilisation for a while.

Pure: the supervisor feeds every metrics sample it records to an IdleGpuWatch and stores
what `observe` answers as the job's `gpu_idle_since` (README "Idle GPUs"). Only ranks that
report a GPU figure count (a rank without GPUs, or without NVML, reports none); a rank
that has not reported this time keeps what it said last (a pod reports every 2 s, the
supervisor records every `metrics_interval`).
"""

from __future__ import annotations

import math
from typing import Any


class IdleGpuWatch:
    def __init__(self, below_percent: float, after_seconds: float):
        self.below_percent = below_percent
        self.after_seconds = after_seconds
        # rank -> since when it has been under the threshold (None: busy at last report)
        self._quiet_since: dict[int, float | None] = {}

    def observe(self, samples: dict[int, dict[str, Any]], now: float) -> float | None:
        """Take one sample per rank; answer since when the job's GPUs have been idle, once
        that has lasted `after_seconds` (else None). `after_seconds <= 0` turns it off."""
        if self.after_seconds <= 0:
            return None
        for rank, sample in samples.items():
            util = sample.get("gpu_util")
            if isinstance(util, bool) or not isinstance(util, (int, float)):
                continue
            if not math.isfinite(util):
                continue  # a rank's report crosses a boundary: nothing but a real figure counts
            if util < self.below_percent:
                if self._quiet_since.get(rank) is None:
                    self._quiet_since[rank] = now
            else:
                self._quiet_since[rank] = None
        quiet = [since for since in self._quiet_since.values() if since is not None]
        if not quiet or len(quiet) < len(self._quiet_since):
            return None  # none reported, or a rank is busy
        since = max(quiet)
        return since if now - since >= self.after_seconds else None
