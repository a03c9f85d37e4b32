"""The ranks' resource metrics in the store: the latest sample on each rank's row, and an
hour of history (METRICS_KEPT_SECONDS) in the `metrics` table for the monitor's curves."""

from __future__ import annotations

import json
import time
from typing import Any

from .database import Database
from .feed import Change, ChangeFeed

METRICS_KEPT_SECONDS = 3600.0


class MetricsTable:
    """The metrics of one store's ranks, each write with its change event."""

    def __init__(self, database: Database, feed: ChangeFeed):
        self.database = database
        self.feed = feed

    def record(
        self, job_id: str, samples: dict[int, dict[str, Any]], ts: float | None = None
    ) -> None:
        """Latest metrics onto the rank rows and into the history, one transaction."""
        ts = ts or time.time()
        with self.database.transaction() as db:
            for rank, m in samples.items():
                db.execute(
                    "UPDATE ranks SET metrics = ? WHERE job_id = ? AND rank = ?",
                    (json.dumps(m), job_id, rank),
                )
                db.execute(
                    "INSERT INTO metrics (job_id, rank, ts, cpu_percent, memory_bytes, gpu_util,"
                    " gpu_memory_bytes) VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (
                        job_id,
                        rank,
                        ts,
                        m.get("cpu_percent"),
                        m.get("memory_bytes"),
                        m.get("gpu_util"),
                        m.get("gpu_memory_bytes"),
                    ),
                )
            db.execute(
                "DELETE FROM metrics WHERE job_id = ? AND ts < ?",
                (job_id, ts - METRICS_KEPT_SECONDS),
            )
            self.feed.record(db, job_id, Change.METRICS)

    def history(self, job_id: str, since: float | None = None) -> dict[int, list[dict[str, Any]]]:
        rows = self.database.connection.execute(
            "SELECT * FROM metrics WHERE job_id = ? AND ts > ? ORDER BY rank, ts",
            (job_id, since or 0.0),
        ).fetchall()
        series: dict[int, list[dict[str, Any]]] = {}
        for r in rows:
            series.setdefault(r["rank"], []).append(
                {
                    "ts": r["ts"],
                    "cpu_percent": r["cpu_percent"],
                    "memory_bytes": r["memory_bytes"],
                    "gpu_util": r["gpu_util"],
                    "gpu_memory_bytes": r["gpu_memory_bytes"],
                }
            )
        return series
