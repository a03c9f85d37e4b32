"""The store's side of a supervising fleet (jobs/running/fleet.py): which unfinished jobs of
a backend there are to supervise, and one heartbeat for all the jobs a fleet holds."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Collection

from .database import Database
from .feed import Change, ChangeFeed


class FleetRows:
    """One store's rows as a fleet reads and beats them."""

    def __init__(self, database: Database, feed: ChangeFeed):
        self.database = database
        self.feed = feed

    def unfinished(self, backend: str, among: Collection[str] | None = None) -> list[sqlite3.Row]:
        """(id, state, supervisor, heartbeat) of the backend's unfinished jobs (`among` those
        ids)."""
        sql = (
            "SELECT id, state, supervisor, heartbeat FROM jobs WHERE backend = ?"
            # Literal, as the partial index jobs_unfinished says it (schema.py): read from it.
            " AND state NOT IN ('succeeded', 'failed', 'cancelled')"
        )
        params: list[object] = [backend]
        if among is not None:
            if not among:
                return []
            sql += f" AND id IN ({', '.join('?' * len(among))})"
            params += list(among)
        return self.database.connection.execute(sql + " ORDER BY created", params).fetchall()

    def claim(self, held: dict[str, str | None], identity: str) -> set[str]:
        """Claim for `identity` each unfinished job of `held` (id -> its supervisor column as
        read) whose claim is still that, in one transaction: the ids claimed. A new fleet
        adopting a thousand jobs writes once, not a thousand claims queued for the lock."""
        return self._swap_claims(held, identity)

    def forget_holders(self, held: dict[str, str | None]) -> set[str]:
        """Clear each unfinished job's claim of `held` that is still as read, in one
        transaction: the ids cleared. One not cleared was claimed since (a new fleet
        adopting its jobs while a reaper goes through the rows it read)."""
        return self._swap_claims(held, None)

    def _swap_claims(self, held: dict[str, str | None], claim: str | None) -> set[str]:
        """Compare and set: each job's supervisor column from what was read to `claim` (a
        claim beats at once). Each change is in the feed: a live fleet adopts a job whose
        claim was forgotten, and a reader sees who holds it now."""
        swapped: set[str] = set()
        now = time.time()
        with self.database.transaction() as db:
            for job_id, holder in held.items():
                cur = db.execute(
                    "UPDATE jobs SET supervisor = ?, heartbeat = COALESCE(?, heartbeat),"
                    " updated = ? WHERE id = ? AND supervisor IS ?"
                    " AND state NOT IN ('succeeded', 'failed', 'cancelled')",
                    (claim, now if claim is not None else None, now, job_id, holder),
                )
                if cur.rowcount == 1:
                    self.feed.record(db, job_id, Change.JOB)
                    swapped.add(job_id)
        return swapped

    def beat(self, identity: str) -> None:
        """Every unfinished job held by `identity` (its supervisor column, which names one
        process) is alive now: one statement, and no change-feed row per job (a heartbeat
        shows nothing; a thousand jobs' beats would crowd the feed's kept window out)."""
        with self.database.transaction() as db:
            db.execute(
                "UPDATE jobs SET heartbeat = ? WHERE supervisor = ?"
                " AND state NOT IN ('succeeded', 'failed', 'cancelled')",
                (time.time(), identity),
            )
