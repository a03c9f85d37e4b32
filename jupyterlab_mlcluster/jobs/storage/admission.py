"""Gang admission in the store: each backend's queue of jobs waiting for resources, and the
decision to start one, taken in one transaction with the resources it takes."""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable
from typing import Any

from ..model import JobState
from .database import Database
from .feed import Change, ChangeFeed
from .jobids import UnknownJob

# decide(job_row, queued_rows_in_order, holding_rows) -> the allocation, or None: wait
Decide = Callable[[sqlite3.Row, list[sqlite3.Row], list[sqlite3.Row]], dict[str, Any] | None]


class AdmissionQueue:
    """The queued jobs of one store, in admission order per backend."""

    def __init__(self, database: Database, feed: ChangeFeed):
        self.database = database
        self.feed = feed

    def order(self, backend: str = "local") -> list[str]:
        """Queued job ids of a backend in admission order: priority, then submission time."""
        rows = self.database.connection.execute(
            "SELECT id FROM jobs WHERE backend = ? AND state = ? "
            "ORDER BY priority DESC, created, id",
            (backend, str(JobState.QUEUED)),
        ).fetchall()
        return [r["id"] for r in rows]

    def position(self, job_id: str, backend: str) -> int | None:
        """Where the job is in its backend's `order` (None: not queued there), counted in
        the store: every read of a queued job asks it, and a thousand queued jobs adopted at
        once each read a thousand ids otherwise."""
        db = self.database.connection
        me = db.execute(
            "SELECT priority, created FROM jobs WHERE id = ? AND backend = ? AND state = ?",
            (job_id, backend, str(JobState.QUEUED)),
        ).fetchone()
        if me is None:
            return None
        ahead = db.execute(
            "SELECT COUNT(*) FROM jobs WHERE backend = ? AND state = ? AND (priority > ?"
            " OR (priority = ? AND (created < ? OR (created = ? AND id < ?))))",
            (backend, str(JobState.QUEUED), me[0], me[0], me[1], me[1], job_id),
        ).fetchone()
        return int(ahead[0])

    def try_admit(self, job_id: str, decide: Decide) -> dict[str, Any] | None:
        """Atomically decide whether a queued job may start, and take its resources.

        `decide(job_row, queued_rows_in_order, holding_rows)` runs inside one IMMEDIATE
        transaction (so two supervisors can never both take the same GPUs) and returns
        the allocation dict, or None to keep waiting. On admission the job becomes
        `starting` with the allocation stored.
        """
        with self.database.transaction() as db:
            me = db.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()
            if me is None:
                raise UnknownJob(job_id)
            if me["state"] != str(JobState.QUEUED):
                return json.loads(me["allocation"]) if me["allocation"] else None
            queued = db.execute(
                "SELECT * FROM jobs WHERE backend = ? AND state = ? "
                "ORDER BY priority DESC, created, id",
                (me["backend"], str(JobState.QUEUED)),
            ).fetchall()
            holding = db.execute(
                "SELECT * FROM jobs WHERE backend = ? AND state IN (?, ?) "
                "AND allocation IS NOT NULL",
                (me["backend"], str(JobState.STARTING), str(JobState.RUNNING)),
            ).fetchall()
            allocation = decide(me, queued, holding)
            if allocation is None:
                return None
            db.execute(
                "UPDATE jobs SET state = ?, allocation = ?, reason = NULL, updated = ? "
                "WHERE id = ?",
                (str(JobState.STARTING), json.dumps(allocation), time.time(), job_id),
            )
            self.feed.record(db, job_id, Change.JOB)
            return allocation
