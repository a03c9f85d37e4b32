"""Pages of the jobs table: the jobs matching a filter (state, backend, owner, parent, ids),
with their ranks, as records or as the JSON that GET /jobs sends."""

from __future__ import annotations

import collections
import contextlib
import json
import sqlite3
import threading
from typing import Any

from ..grouping import PARENT_SQL, TOP_LEVEL
from ..model import JobState
from ..record import JobRecord
from .admission import AdmissionQueue
from .database import Database
from .rows import job_from_row
from .schema import VERSION_COUNTER, VERSION_TRIGGERS

# Rendered jobs remembered (a few KB each): forty pages of the sidebar's default size.
RENDERED_KEPT = 4096


class JobPages:
    """Listings of one store's jobs (a queued one with its place in its backend's queue).

    GET /jobs renders the same jobs on every request: their JSON is remembered by (id,
    version), `version` being what every write of a job's or its ranks' rows sets anew
    (schema.VERSION_TRIGGERS), so a page of unchanged jobs is one read of an index and of
    those two columns, not of every row and rank."""

    def __init__(self, database: Database, admission: AdmissionQueue):
        self.database = database
        self.admission = admission
        self._rendered: collections.OrderedDict[tuple[str, int], str] = collections.OrderedDict()
        self._rendered_lock = threading.Lock()  # GET /jobs runs in the server's threads
        self._has_versions: bool | None = None

    @staticmethod
    def _where(
        *,
        states: list[str] | None = None,
        backend: str | None = None,
        owner: str | None = None,
        parent: str | None = None,
        ids: list[str] | None = None,
    ) -> tuple[str, list[Any]]:
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
        return (f"WHERE {' AND '.join(where)}" if where else ""), args

    def _select(
        self,
        columns: str,
        filters: dict[str, Any],
        limit: int | None = None,
        offset: int = 0,
        newest_first: bool = True,
    ) -> tuple[list[sqlite3.Row], int]:
        """`columns` of the page of jobs matching `filters` (see `rows`), and how many
        match in all."""
        clause, args = self._where(**filters)
        db = self.database.connection
        total = db.execute(f"SELECT COUNT(*) FROM jobs {clause}", args).fetchone()[0]
        order = "DESC" if newest_first else "ASC"
        page = f"LIMIT {int(limit)} OFFSET {int(offset)}" if limit is not None else ""
        rows = db.execute(
            f"SELECT {columns} FROM jobs {clause} ORDER BY created {order}, id {page}", args
        ).fetchall()
        return rows, total

    def _with_ranks(self, rows: list[sqlite3.Row]) -> list[tuple[sqlite3.Row, list[sqlite3.Row]]]:
        ids = [r["id"] for r in rows]
        rank_rows: dict[str, list[sqlite3.Row]] = {i: [] for i in ids}
        db = self.database.connection
        for chunk_start in range(0, len(ids), 500):
            chunk = ids[chunk_start : chunk_start + 500]
            for rr in db.execute(
                f"SELECT * FROM ranks WHERE job_id IN ({','.join('?' * len(chunk))}) ORDER BY rank",
                chunk,
            ):
                rank_rows[rr["job_id"]].append(rr)
        return [(r, rank_rows[r["id"]]) for r in rows]

    def rows(
        self,
        *,
        limit: int | None = None,
        offset: int = 0,
        newest_first: bool = True,
        **filters: Any,
    ) -> tuple[list[tuple[sqlite3.Row, list[sqlite3.Row]]], int]:
        """The rows (job, its ranks) of the jobs matching every filter given (`states`,
        `backend`; `owner`: only that user's; `parent`: only those listed under that job or
        sweep, or with grouping.TOP_LEVEL those under none; `ids`: only those of these ids
        still stored), newest first unless told; and how many match in all."""
        rows, total = self._select("*", filters, limit, offset, newest_first)
        return self._with_ranks(rows), total

    def records(self, **filters: Any) -> tuple[list[JobRecord], int]:
        """Jobs matching every filter given (`owner`: only that user's; see `rows`)."""
        page, total = self.rows(**filters)
        return self._with_queue_positions([job_from_row(r, ranks) for r, ranks in page]), total

    def json(
        self,
        *,
        limit: int | None = None,
        offset: int = 0,
        newest_first: bool = True,
        **filters: Any,
    ) -> tuple[list[str], int]:
        """`records`, each job as the JSON text of its JobRecord.to_json(). A job that is
        not queued is rendered from its rows alone, once a version (see the class); a
        queued one's place in line is not in its rows, so it is rendered on every read."""
        if not self._versioned():
            page, total = self.rows(
                limit=limit, offset=offset, newest_first=newest_first, **filters
            )
            return list(self._render(page, remember=False).values()), total
        keys, total = self._select("id, version", filters, limit, offset, newest_first)
        texts: dict[str, str] = {}
        with self._rendered_lock:
            for key in keys:
                text = self._rendered.get((key["id"], key["version"]))
                if text is not None:
                    self._rendered.move_to_end((key["id"], key["version"]))
                    texts[key["id"]] = text
        missing = [key["id"] for key in keys if key["id"] not in texts]
        if missing:
            # No transaction needed: each job row is read before its ranks, so a text is
            # never older than the version it is kept under (a later one gets a new key).
            # The filters again: a job that stopped matching between the reads is left out.
            fresh, _ = self.rows(**{**filters, "ids": missing})
            # The full-disk fallback's connection (immutable: no locks, no WAL) may mix
            # what it reads: its texts are not kept for other readers.
            texts.update(self._render(fresh, remember=not self.database.read_only))
        # (A job purged between the two reads is left out.)
        return [texts[key["id"]] for key in keys if key["id"] in texts], total

    def _versioned(self) -> bool:
        """Does every write of the store set versions (its column, counter and triggers:
        schema.VERSION_TRIGGERS, all made in one transaction)? Not a store an older version
        wrote, read here only through the full-disk fallback (its schema could not be
        brought up to date)."""
        if self._has_versions is None:
            db = self.database.connection
            columns = {c["name"] for c in db.execute("PRAGMA table_info(jobs)")}
            made = {
                r["name"]
                for r in db.execute(
                    "SELECT name FROM sqlite_master WHERE type IN ('table', 'trigger')"
                )
            }
            wanted = {VERSION_COUNTER, *VERSION_TRIGGERS}
            self._has_versions = "version" in columns and wanted <= made
        return self._has_versions

    def _render(
        self, page: list[tuple[sqlite3.Row, list[sqlite3.Row]]], *, remember: bool
    ) -> dict[str, str]:
        queued = [job_from_row(r, ranks) for r, ranks in page if r["state"] == JobState.QUEUED]
        positioned = iter(self._with_queue_positions(queued))
        texts = {}
        for row, ranks in page:
            if row["state"] == JobState.QUEUED:
                texts[row["id"]] = json.dumps(next(positioned).to_json(), allow_nan=False)
            else:
                texts[row["id"]] = json.dumps(job_from_row(row, ranks).to_json(), allow_nan=False)
        if remember:
            with self._rendered_lock:
                for row, _ in page:
                    if row["state"] != JobState.QUEUED:
                        self._rendered[(row["id"], row["version"])] = texts[row["id"]]
                while len(self._rendered) > RENDERED_KEPT:
                    self._rendered.popitem(last=False)
        return texts

    def _with_queue_positions(self, records: list[JobRecord]) -> list[JobRecord]:
        queued = [r for r in records if r.state == JobState.QUEUED]
        if queued:
            order_ids = {b: self.admission.order(b) for b in {r.backend for r in queued}}
            for r in queued:
                with contextlib.suppress(ValueError):
                    r.queue_position = order_ids[r.backend].index(r.id)
        return records
