"""The job store: SQLite (WAL) for job and rank state, plain files for everything big.

Layout under the store root (default: <jupyter data dir>/mlcluster):

    jobs.db                      jobs, ranks, metrics history, change feed (events)
    jobs/<id>/payload.pkl        code + pushed variables (0600)
    jobs/<id>/result.pkl         rank 0's pulled variables / last expression value
    jobs/<id>/error-<rank>.json  a failed rank's exception and traceback
    jobs/<id>/logs/rank-<r>.log  "<epoch> <o|e|s> <text>" lines, one file per rank

Every process (kernel, CLI, server, supervisors) opens the same store; SQLite's locking
is the only coordination. Each mutation appends to the `events` table in the same
transaction, so readers can follow changes by sequence number instead of diffing.

What is where: `JobStore` (here) holds the SQL statements on jobs and ranks; a job's files
are where its base, files.JobFiles, says; it owns the objects over the same database that
keep the rest, each write with its change event in the same transaction: the change feed
(feed.py), sessions (session_table.py), gang admission (admission.py), metrics
(metrics_table.py), listings (pages.py), and the root's reserve (root.py). The schema,
migrations and journal mode are in schema.py, rows <-> JobRecord in rows.py, log reads in
logs.py, what the experiment store reads of the jobs table in summaries.py.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..model import JobState, RankState
from ..record import JobRecord
from . import logs as store_logs
from .admission import AdmissionQueue, Decide
from .database import Database
from .feed import EVENTS_KEPT, Change, ChangeFeed
from .files import STAGING_PREFIX, STAGING_STALE, JobFiles
from .fleet_rows import FleetRows
from .jobids import UnknownJob, check_job_id
from .metrics_table import METRICS_KEPT_SECONDS, MetricsTable
from .pages import JobPages
from .root import RESERVE_BYTES, RESERVE_NAME, Reserve, UnsafeStore, check_store_root
from .rows import JOB_COLUMNS, RANK_COLUMNS, job_from_row, to_column
from .schema import JOURNAL_MODES, choose_journal_mode, ensure_schema
from .schema import SCHEMA as SCHEMA  # re-exported: tests build older stores from it
from .session_table import SessionTable
from .summaries import job_summaries, sweep_job_ids, unfinished_among

__all__ = [  # what the package and the tests import from here
    "EVENTS_KEPT",
    "METRICS_KEPT_SECONDS",
    "RESERVE_BYTES",
    "RESERVE_NAME",
    "STAGING_PREFIX",
    "STAGING_STALE",
    "Change",
    "JobStore",
    "UnknownJob",
    "UnsafeStore",
    "check_job_id",
    "job_summaries",
    "sweep_job_ids",
    "unfinished_among",
]

log = logging.getLogger("jupyterlab_mlcluster.store")


class JobStore(JobFiles):
    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        journal_mode: str = "auto",
        mountinfo: str | os.PathLike[str] | None = None,
    ):
        """`journal_mode`: auto (WAL, or DELETE where the store is on a network filesystem),
        wal or delete. `mountinfo`: the file that says which filesystem holds the store
        (default /proc/self/mountinfo; tests hand in a fabricated one)."""
        if journal_mode not in JOURNAL_MODES:
            raise ValueError(f"journal_mode must be one of {JOURNAL_MODES}, got {journal_mode!r}")
        super().__init__(Path(root))
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        check_store_root(self.root)
        (self.root / "jobs").mkdir(exist_ok=True, mode=0o700)
        self.db_path = self.root / "jobs.db"
        self.database = Database(self.db_path)
        self.journal_mode = choose_journal_mode(self.root, journal_mode, mountinfo)
        ensure_schema(self.database, self.root, self.journal_mode)
        self.feed = ChangeFeed(self.database)
        self.sessions = SessionTable(self.database, self.feed)
        self.admission = AdmissionQueue(self.database, self.feed)
        self.metrics = MetricsTable(self.database, self.feed)
        self.pages = JobPages(self.database, self.admission)
        self.reserve = Reserve(self.root, self.database)
        self.fleet = FleetRows(self.database, self.feed)
        self.keep_reserve()

    # -- the reserve ---------------------------------------------------------------------

    def keep_reserve(self) -> None:
        """Make the reserve if it is missing and there is room (root.Reserve.keep)."""
        self.reserve.keep()

    def release_reserve(self) -> bool:
        """Give the reserve's space back (a full disk); True if there was one to give."""
        return self.reserve.release()

    # -- connections -------------------------------------------------------------------

    @property
    def _db(self) -> sqlite3.Connection:
        return self.database.connection

    def _tx(self) -> contextlib.AbstractContextManager[sqlite3.Connection]:
        return self.database.transaction()

    def close(self) -> None:
        self.database.close()

    # -- paths (files.py) -----------------------------------------------------------------

    def drop_result(self, job_id: str) -> None:
        """Forget a delivered result: its file(s) (any form of it) and the job's
        has_result, so nothing claims a result that is gone."""
        for path in self.job_dir(job_id).glob("result.*"):
            path.unlink(missing_ok=True)
        self.update_job(job_id, has_result=False)

    # -- jobs --------------------------------------------------------------------------

    def insert_job(
        self,
        record: JobRecord,
        payload: bytes | None = None,
        files: dict[str, bytes] | None = None,
    ) -> None:
        """Store a new job: its row, and its directory with the payload and `files` (name ->
        content, each 0600). All or nothing: the files are written into a staging directory
        that becomes jobs/<id> inside the transaction inserting the row; if anything fails
        (a full disk), neither the row nor the directory exists afterwards."""
        job_dir = self.job_dir(record.id)
        staging = job_dir.with_name(f"{STAGING_PREFIX}{record.id}")
        contents = dict(files or {})
        if payload is not None:
            contents[self.payload_path(record.id).name] = payload
        renaming = False
        try:
            staging.mkdir(mode=0o700)
            (staging / "logs").mkdir(mode=0o700)
            for name, data in contents.items():
                if "/" in name or name in ("", ".", ".."):
                    raise ValueError(f"not a file name: {name!r}")
                fd = os.open(staging / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
            now = time.time()
            with self._tx() as db:
                self._insert_rows(db, record, now)  # a taken id fails here, before the rename
                renaming = True
                os.rename(staging, job_dir)  # jobs/<id> never exists half-written
        except BaseException:
            # Whatever stopped it (a full disk, a failed COMMIT, Ctrl-C) left no row, so
            # neither directory may stay; unless a Ctrl-C came just after the COMMIT: then
            # the row is there and its directory with it.
            shutil.rmtree(staging, ignore_errors=True)
            self.database.end_interrupted()  # then the row is either committed or gone
            if renaming and not self._has_row(record.id):
                shutil.rmtree(job_dir, ignore_errors=True)
            raise

    def _has_row(self, job_id: str) -> bool:
        try:
            return self.cancel_requested(job_id) is not None  # None: no such row
        except sqlite3.Error:
            return False  # unreadable: the failed write is the likelier story

    def _insert_rows(self, db: sqlite3.Connection, record: JobRecord, now: float) -> None:
        db.execute(
            "INSERT INTO jobs (id, name, state, backend, priority, spec, created, owner,"
            " origin, capacity, backend_state, reason, updated)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                record.id,
                record.name,
                str(record.state),
                record.spec.backend,
                record.spec.priority,
                json.dumps(record.spec.to_dict()),
                record.created or now,
                record.owner,
                json.dumps(record.origin),
                json.dumps(record.capacity) if record.capacity is not None else None,
                json.dumps(record.backend_state),
                record.reason,
                now,
            ),
        )
        db.executemany(
            "INSERT INTO ranks (job_id, rank, state) VALUES (?, ?, ?)",
            [(record.id, r, str(RankState.PENDING)) for r in range(record.spec.workers)],
        )
        self._event(db, record.id, Change.CREATED)

    def get_job(self, job_id: str) -> JobRecord:
        check_job_id(job_id)
        db = self._db
        row = db.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()
        if row is None:
            raise UnknownJob(job_id)
        ranks = db.execute(
            "SELECT * FROM ranks WHERE job_id = ? ORDER BY rank", (job_id,)
        ).fetchall()
        record = job_from_row(row, ranks)
        if record.state == JobState.QUEUED:
            record.queue_position = self.queue_position(job_id, record.backend)
        return record

    def find_jobs(self, id_or_name: str) -> list[JobRecord]:
        """A job by id, or else every job with that name, newest first."""
        with contextlib.suppress(UnknownJob):
            return [self.get_job(id_or_name)]
        rows = self._db.execute(
            "SELECT id FROM jobs WHERE name = ? ORDER BY created DESC", (id_or_name,)
        ).fetchall()
        return [self.get_job(r["id"]) for r in rows]

    def job_owners(self, ids: list[str] | None = None) -> dict[str, str | None]:
        """id -> owner of every job (or of those of `ids` that exist)."""
        if ids is None:
            rows = self._db.execute("SELECT id, owner FROM jobs").fetchall()
        else:
            marks = ",".join("?" * len(ids))
            rows = self._db.execute(
                f"SELECT id, owner FROM jobs WHERE id IN ({marks})", ids
            ).fetchall()
        return {r["id"]: r["owner"] for r in rows}

    def list_jobs(self, **filters: Any) -> tuple[list[JobRecord], int]:
        """Jobs matching every filter given (`owner`: only that user's; pages.JobPages.rows)."""
        return self.pages.records(**filters)

    def list_json(self, **filters: Any) -> tuple[list[str], int]:
        """`list_jobs`, each job as the JSON text of its JobRecord.to_json()."""
        return self.pages.json(**filters)

    def unfinished_jobs(self) -> list[sqlite3.Row]:
        """(id, supervisor, heartbeat, created, backend, cancel_requested, session_job) of
        every job not final: what the reaper needs to judge whether each one's supervisor
        still lives (`session_job`: a session's cell names its session's job, whose end is
        the cell's)."""
        return self._db.execute(
            "SELECT id, supervisor, heartbeat, created, backend, cancel_requested,"
            " json_extract(origin, '$.session_job') AS session_job FROM jobs"
            # Literal, as the partial index jobs_unfinished says it (schema.py): read from it.
            " WHERE state NOT IN ('succeeded', 'failed', 'cancelled')"
        ).fetchall()

    def held_allocations(self, backend: str) -> list[sqlite3.Row]:
        """Rows of the jobs of `backend` holding resources (starting or running)."""
        return self._db.execute(
            "SELECT * FROM jobs WHERE backend = ? AND state IN ('starting', 'running')"
            " AND allocation IS NOT NULL",
            (backend,),
        ).fetchall()

    def cancel_requested(self, job_id: str) -> bool | None:
        """Has someone asked to cancel the job? None: the job is gone (purged)."""
        row = self._db.execute(
            "SELECT cancel_requested FROM jobs WHERE id = ?", (job_id,)
        ).fetchone()
        return None if row is None else bool(row[0])

    def rank_processes(self, job_id: str) -> list[tuple[int, int, float | None]]:
        """(rank, pid, process start time) of every rank that was given a process."""
        rows = self._db.execute(
            "SELECT rank, pid, process_start FROM ranks WHERE job_id = ? AND pid IS NOT NULL",
            (job_id,),
        ).fetchall()
        return [(row["rank"], row["pid"], row["process_start"]) for row in rows]

    def claim_supervisor(
        self,
        job_id: str,
        me: dict[str, Any],
        holder_alive: Callable[[dict[str, Any], float | None], bool],
    ) -> bool:
        """Record `me` as the job's supervisor, atomically; False if the job is final or
        gone, or another supervisor holds it and `holder_alive(its identity, heartbeat)`."""
        with self._tx() as db:
            row = db.execute(
                "SELECT supervisor, state, heartbeat FROM jobs WHERE id = ?", (job_id,)
            ).fetchone()
            if row is None or JobState(row["state"]).final:
                return False
            if row["supervisor"]:
                other = json.loads(row["supervisor"])
                if other != me and holder_alive(other, row["heartbeat"]):
                    return False
            now = time.time()
            db.execute(
                "UPDATE jobs SET supervisor = ?, heartbeat = ?, updated = ? WHERE id = ?",
                (json.dumps(me), now, now, job_id),
            )
            self._event(db, job_id, Change.JOB)
        return True

    def pending_cleanups(self) -> list[str]:
        """Jobs whose backend recorded a cleanup still to do (`backend_state.pending_cleanup`:
        e.g. Kubernetes objects not yet deleted), final or not."""
        rows = self._db.execute(
            "SELECT id FROM jobs WHERE json_extract(backend_state, '$.pending_cleanup') IS NOT NULL"
        ).fetchall()
        return [row["id"] for row in rows]

    def update_job(self, job_id: str, *, event: Change = Change.JOB, **fields: Any) -> None:
        unknown = set(fields) - JOB_COLUMNS
        if unknown:
            raise ValueError(f"not job columns: {unknown}")
        if not fields:
            return
        values = [to_column(k, v) for k, v in fields.items()]
        with self._tx() as db:
            cur = db.execute(
                f"UPDATE jobs SET {', '.join(f'{k} = ?' for k in fields)}, updated = ? "
                "WHERE id = ?",
                [*values, time.time(), job_id],
            )
            if cur.rowcount == 0:
                raise UnknownJob(job_id)
            self._event(db, job_id, event)

    def transition(self, job_id: str, state: JobState, **fields: Any) -> bool:
        """Move a job to `state` unless it is already final. Returns whether it moved.

        Final states are sticky: a late writer (a dying supervisor, a reaper) can never
        turn `cancelled` into `failed` or back into `running`.
        """
        values = {"state": str(state), **fields}
        if state.final and "finished" not in values:
            values["finished"] = time.time()
        cols = [to_column(k, v) for k, v in values.items()]
        finals = [str(s) for s in (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)]
        with self._tx() as db:
            cur = db.execute(
                f"UPDATE jobs SET {', '.join(f'{k} = ?' for k in values)}, updated = ?"
                f" WHERE id = ? AND state NOT IN (?, ?, ?)",
                [*cols, time.time(), job_id, *finals],
            )
            if cur.rowcount:
                self._event(db, job_id, Change.JOB)
            return bool(cur.rowcount)

    def update_ranks(
        self, job_id: str, changes: dict[int, dict[str, Any]], *, event: Change = Change.RANKS
    ) -> None:
        """Several ranks in one transaction (one change event)."""
        if not changes:
            return
        with self._tx() as db:
            for rank, fields in changes.items():
                unknown = set(fields) - RANK_COLUMNS
                if unknown:
                    raise ValueError(f"not rank columns: {unknown}")
                if not fields:
                    continue
                db.execute(
                    f"UPDATE ranks SET {', '.join(f'{k} = ?' for k in fields)} "
                    "WHERE job_id = ? AND rank = ?",
                    [*(to_column(k, v) for k, v in fields.items()), job_id, rank],
                )
            self._event(db, job_id, event)

    def record_metrics(
        self, job_id: str, samples: dict[int, dict[str, Any]], ts: float | None = None
    ) -> None:
        """Latest metrics onto the rank rows and into the history (metrics_table.py)."""
        self.metrics.record(job_id, samples, ts)

    def metrics_history(
        self, job_id: str, since: float | None = None
    ) -> dict[int, list[dict[str, Any]]]:
        check_job_id(job_id)
        return self.metrics.history(job_id, since)

    def request_cancel(self, job_id: str, reason: str | None = None) -> JobRecord:
        """Ask the job's supervisor to stop it; `reason` ('cancelled by ...', who or what
        asked) becomes the job's reason, so the end names what stopped it."""
        with self._tx() as db:
            if reason is None:
                cur = db.execute(
                    "UPDATE jobs SET cancel_requested = 1, updated = ? WHERE id = ?",
                    (time.time(), job_id),
                )
            else:
                cur = db.execute(
                    "UPDATE jobs SET cancel_requested = 1, reason = ?, updated = ?"
                    " WHERE id = ? AND NOT cancel_requested",
                    (reason, time.time(), job_id),
                )
                if cur.rowcount == 0 and self.cancel_requested(job_id) is not None:
                    return self.get_job(job_id)  # asked before: the first asker's reason stays
            if cur.rowcount == 0:
                raise UnknownJob(job_id)
            self._event(db, job_id, Change.JOB)
        return self.get_job(job_id)

    def delete_job(self, job_id: str) -> None:
        """Forget a job: rows and files. Callers make sure nothing of it still runs."""
        check_job_id(job_id)
        with self._tx() as db:
            cur = db.execute("DELETE FROM jobs WHERE id = ?", (job_id,))
            if cur.rowcount == 0:
                raise UnknownJob(job_id)
            db.execute("DELETE FROM ranks WHERE job_id = ?", (job_id,))
            db.execute("DELETE FROM metrics WHERE job_id = ?", (job_id,))
            db.execute("DELETE FROM sessions WHERE job_id = ?", (job_id,))
            self._event(db, job_id, Change.DELETED)
        shutil.rmtree(self.job_dir(job_id), ignore_errors=True)

    # -- sessions (jobs/sessions.py; session_table.py) -------------------------------------

    def add_session(self, job_id: str, owner: str | None, name: str) -> str:
        return self.sessions.add(job_id, owner, name)

    def session_rows(
        self, owner: str | None = None, name: str | None = None, *, live_only: bool = False
    ) -> list[dict[str, Any]]:
        return self.sessions.rows(owner, name, live_only=live_only)

    def update_session(self, job_id: str, **fields: Any) -> None:
        self.sessions.update(job_id, **fields)

    def session_row(self, job_id: str) -> dict[str, Any] | None:
        return self.sessions.row(job_id)

    def session_cells(self, holder_id: str, states: list[str]) -> list[str]:
        return self.sessions.cells(holder_id, states)

    # -- gang admission (admission.py) ----------------------------------------------------

    def queue(self, backend: str = "local") -> list[str]:
        return self.admission.order(backend)

    def queue_position(self, job_id: str, backend: str) -> int | None:
        return self.admission.position(job_id, backend)

    def try_admit(self, job_id: str, decide: Decide) -> dict[str, Any] | None:
        return self.admission.try_admit(job_id, decide)

    # -- change feed (feed.py) -------------------------------------------------------------

    def notify(self, job_id: str, kind: Change) -> None:
        """A change that lives outside the database (new log lines) -> the change feed."""
        self.feed.notify(job_id, kind)

    def _event(self, db: sqlite3.Connection, job_id: str, kind: Change) -> None:
        self.feed.record(db, job_id, kind)

    def last_seq(self) -> int:
        return self.feed.last_seq()

    def events_since(self, seq: int, limit: int = 5000) -> list[tuple[int, str, str]]:
        return self.feed.events_since(seq, limit)

    def data_version(self) -> int:
        return self.feed.data_version()

    # -- logs ----------------------------------------------------------------------------

    def read_logs(
        self,
        job_id: str,
        rank: int | None = None,
        cursor: str | None = None,
        *,
        max_bytes: int = 4 * 1024 * 1024,
        tail: int | None = None,
    ) -> tuple[list[dict[str, Any]], str]:
        """See logs.read_logs (this package)."""
        return store_logs.read_logs(self, job_id, rank, cursor, max_bytes=max_bytes, tail=tail)
