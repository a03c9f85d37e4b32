"""The store's sessions (jobs/sessions.py): a session is a long-running job (its "holder": the
gang's allocation, supervisor and ranks) plus a row of the `sessions` table; each cell run in
it is a job of its own whose origin names the holder (`session_job`)."""

from __future__ import annotations

import time
from typing import Any

from ..model import JobState
from .database import Database
from .feed import Change, ChangeFeed


class SessionTable:
    """The `sessions` table of one store, each write with its change event."""

    def __init__(self, database: Database, feed: ChangeFeed):
        self.database = database
        self.feed = feed

    def add(self, job_id: str, owner: str | None, name: str) -> str:
        """Record `job_id` as the session `name` of `owner`, unless a live one (its holder
        job not final) already has that name: then that one's holder id is returned and
        nothing is written. Decided in one transaction, so two kernels starting the same
        session at once get one session."""
        finals = [str(s) for s in (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)]
        with self.database.transaction() as db:
            live = db.execute(
                "SELECT s.job_id FROM sessions s JOIN jobs j ON j.id = s.job_id"
                " WHERE s.owner IS ? AND s.name = ? AND j.state NOT IN (?, ?, ?)"
                " ORDER BY s.created DESC LIMIT 1",
                (owner, name, *finals),
            ).fetchone()
            if live is not None:
                return live["job_id"]
            db.execute(
                "INSERT INTO sessions (job_id, owner, name, created, idle_since)"
                " VALUES (?, ?, ?, ?, ?)",
                (job_id, owner, name, time.time(), time.time()),
            )
            self.feed.record(db, job_id, Change.SESSION)
            return job_id

    def rows(
        self, owner: str | None = None, name: str | None = None, *, live_only: bool = False
    ) -> list[dict[str, Any]]:
        """Sessions (newest first) with their holder job's state and reason."""
        where, args = ["1 = 1"], []
        if owner is not None:
            where.append("s.owner IS ?")
            args.append(owner)
        if name is not None:
            where.append("s.name = ?")
            args.append(name)
        if live_only:
            finals = [str(s) for s in (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)]
            where.append("j.state NOT IN (?, ?, ?)")
            args.extend(finals)
        rows = self.database.connection.execute(
            "SELECT s.*, j.state AS state, j.reason AS reason, j.error AS error,"
            " j.finished AS finished FROM sessions s JOIN jobs j ON j.id = s.job_id"
            f" WHERE {' AND '.join(where)} ORDER BY s.created DESC",
            args,
        ).fetchall()
        return [dict(r) for r in rows]

    def update(self, job_id: str, **fields: Any) -> None:
        allowed = {"cells", "idle_since", "end_reported", "restart_requested"}
        if not fields or set(fields) - allowed:
            raise ValueError(f"session fields are {sorted(allowed)}")
        with self.database.transaction() as db:
            db.execute(
                f"UPDATE sessions SET {', '.join(f'{k} = ?' for k in fields)} WHERE job_id = ?",
                [*fields.values(), job_id],
            )
            self.feed.record(db, job_id, Change.SESSION)

    def row(self, job_id: str) -> dict[str, Any] | None:
        row = self.database.connection.execute(
            "SELECT * FROM sessions WHERE job_id = ?", (job_id,)
        ).fetchone()
        return dict(row) if row is not None else None

    def cells(self, holder_id: str, states: list[str]) -> list[str]:
        """Ids of the cells of the session `holder_id` in `states`, oldest first."""
        rows = self.database.connection.execute(
            "SELECT id FROM jobs WHERE json_extract(origin, '$.session_job') = ?"
            f" AND state IN ({','.join('?' * len(states))}) ORDER BY created, id",
            [holder_id, *states],
        ).fetchall()
        return [r["id"] for r in rows]
