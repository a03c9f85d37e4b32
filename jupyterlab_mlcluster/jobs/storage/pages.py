"""Pages of the jobs table: the jobs matching a filter (state, backend, owner, parent, ids),
with their ranks, as records or as the JSON that GET /jobs sends."""

from __future__ import annotations

import contextlib
import json
import sqlite3
from typing import Any

from ..grouping import PARENT_SQL, TOP_LEVEL
from ..model import JobState
from ..record import JobRecord
from .admission import AdmissionQueue
from .database import Database
from .rows import job_from_row, job_json


class JobPages:
    """Listings of one store's jobs (a queued one with its place in its backend's queue)."""

    def __init__(self, database: Database, admission: AdmissionQueue):
        self.database = database
        self.admission = admission

    def rows(
        self,
        *,
        states: list[str] | None = None,
        backend: str | None = None,
        owner: str | None = None,
        parent: str | None = None,
        ids: list[str] | None = None,
        limit: int | None = None,
        offset: int = 0,
        newest_first: bool = True,
    ) -> tuple[list[tuple[sqlite3.Row, list[sqlite3.Row]]], int]:
        """The rows (job, its ranks) of the jobs matching every filter given (`owner`: only
        that user's; `parent`: only those listed under that job or sweep, or with
        grouping.TOP_LEVEL those under none; `ids`: only those of these ids still stored),
        newest first unless told; and how many match in all."""
        where: list[str] = []
        args: list[Any] = []
        if ids is not None:
            where.append("id IN (SELECT value FROM json_each(?))")
            args.append(json.dumps(ids))
        if states:
            where.append(f"state IN ({','.join('?' * len(states))})")
            args.extend(states)
        if backend:
            where.append("backend = ?")
            args.append(backend)
        if owner is not None:
            where.append("owner = ?")
            args.append(owner)
        if parent == TOP_LEVEL:
            where.append(f"{PARENT_SQL} IS NULL")
        elif parent is not None:
            where.append(f"{PARENT_SQL} = ?")
            args.append(parent)
        clause = f"WHERE {' AND '.join(where)}" if where else ""
        db = self.database.connection
        total = db.execute(f"SELECT COUNT(*) FROM jobs {clause}", args).fetchone()[0]
        order = "DESC" if newest_first else "ASC"
        page = f"LIMIT {int(limit)} OFFSET {int(offset)}" if limit is not None else ""
        rows = db.execute(
            f"SELECT * FROM jobs {clause} ORDER BY created {order}, id {page}", args
        ).fetchall()
        ids = [r["id"] for r in rows]
        rank_rows: dict[str, list[sqlite3.Row]] = {i: [] for i in ids}
        for chunk_start in range(0, len(ids), 500):
            chunk = ids[chunk_start : chunk_start + 500]
            for rr in db.execute(
                f"SELECT * FROM ranks WHERE job_id IN ({','.join('?' * len(chunk))}) ORDER BY rank",
                chunk,
            ):
                rank_rows[rr["job_id"]].append(rr)
        return [(r, rank_rows[r["id"]]) for r in rows], total

    def records(self, **filters: Any) -> tuple[list[JobRecord], int]:
        """Jobs matching every filter given (`owner`: only that user's; see `rows`)."""
        page, total = self.rows(**filters)
        return self._with_queue_positions([job_from_row(r, ranks) for r, ranks in page]), total

    def json(self, **filters: Any) -> tuple[list[str], int]:
        """`records`, each job as the JSON text of its JobRecord.to_json(): a job that is
        not queued is rendered from its rows alone, once for the same rows (rows.job_json)."""
        page, total = self.rows(**filters)
        queued = [job_from_row(r, ranks) for r, ranks in page if r["state"] == JobState.QUEUED]
        positioned = iter(self._with_queue_positions(queued))
        return [
            json.dumps(next(positioned).to_json(), allow_nan=False)
            if r["state"] == JobState.QUEUED
            else job_json(r, tuple(ranks))
            for r, ranks in page
        ], total

    def _with_queue_positions(self, records: list[JobRecord]) -> list[JobRecord]:
        queued = [r for r in records if r.state == JobState.QUEUED]
        if queued:
            order_ids = {b: self.admission.order(b) for b in {r.backend for r in queued}}
            for r in queued:
                with contextlib.suppress(ValueError):
                    r.queue_position = order_ids[r.backend].index(r.id)
        return records
