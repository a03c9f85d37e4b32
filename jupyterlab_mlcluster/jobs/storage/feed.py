"""The store's change feed: the `events` table, one row per change to a job, written in
the transaction of the change itself, so readers follow changes by sequence number
(watch.py, snapshot.py) instead of diffing."""

from __future__ import annotations

import enum
import sqlite3
import time

from .database import Database

# Keep this many change-feed rows; readers further behind resynchronise from a snapshot.
EVENTS_KEPT = 20_000


class Change(enum.StrEnum):
    """What a row of the change feed (the `events` table) says changed about a job."""

    CREATED = "created"
    JOB = "job"  # its row: state, reason, supervisor, ...
    RANKS = "ranks"
    METRICS = "metrics"
    LOGS = "logs"  # new lines in its log files (written outside the database)
    HEARTBEAT = "heartbeat"  # its supervisor is alive: nothing a follower shows
    SESSION = "session"
    DELETED = "deleted"


class ChangeFeed:
    """The change feed of one store's database."""

    def __init__(self, database: Database):
        self.database = database

    def notify(self, job_id: str, kind: Change) -> None:
        """A change that lives outside the database (new log lines) -> the change feed."""
        with self.database.transaction() as db:
            self.record(db, job_id, kind)

    def record(self, db: sqlite3.Connection, job_id: str, kind: Change) -> None:
        """`kind` of change to `job_id`, in the transaction (`db`) that made it."""
        cur = db.execute(
            "INSERT INTO events (ts, job_id, kind) VALUES (?, ?, ?)", (time.time(), job_id, kind)
        )
        seq = cur.lastrowid or 0
        if seq % 1000 == 0:
            db.execute("DELETE FROM events WHERE seq <= ?", (seq - EVENTS_KEPT,))

    def last_seq(self) -> int:
        row = self.database.connection.execute("SELECT MAX(seq) FROM events").fetchone()
        return row[0] or 0

    def events_since(self, seq: int, limit: int = 5000) -> list[tuple[int, str, str]]:
        """[(seq, job_id, kind)] after `seq`. If `seq` fell out of the kept window, the
        first element is (-1, '', 'resync'): the reader must take a fresh snapshot."""
        db = self.database.connection
        rows = db.execute(
            "SELECT seq, job_id, kind FROM events WHERE seq > ? ORDER BY seq LIMIT ?", (seq, limit)
        ).fetchall()
        if seq and rows and rows[0]["seq"] > seq + 1:
            oldest = db.execute("SELECT MIN(seq) FROM events").fetchone()[0]
            if oldest is not None and oldest > seq + 1:
                return [(-1, "", "resync")] + [(r[0], r[1], r[2]) for r in rows]
        return [(r[0], r[1], r[2]) for r in rows]

    def data_version(self) -> int:
        """Changes whenever another connection commits; a cheap "anything new?" probe."""
        return self.database.connection.execute("PRAGMA data_version").fetchone()[0]
