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

What is where: `JobStore` (here) holds every SQL statement on jobs, ranks, metrics, sessions
and the change feed, and the paths of a job's files; the schema, migrations and journal mode
are in schema.py, rows <-> JobRecord in rows.py, log reads in logs.py.
Why this module is still over 500 lines: the SQL stays in one class on purpose (issue 24:
"all SQL in the store"), each write with its change event in the same transaction.

Over 500 lines on purpose: every SQL statement on the store's tables is here; its schema,
rows and log reads are the modules beside it.
"""

from __future__ import annotations

import contextlib
import enum
import json
import logging
import os
import shutil
import sqlite3
import stat
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ...runtime.atomic import write_whole
from ..grouping import PARENT_SQL, TOP_LEVEL
from ..model import FINAL_STATES, JOB_ID_RE, JobState, RankState
from ..record import JobRecord
from . import logs as store_logs
from .database import Database
from .rows import JOB_COLUMNS, RANK_COLUMNS, job_from_row, job_json, to_column
from .schema import JOURNAL_MODES, choose_journal_mode, ensure_schema
from .schema import SCHEMA as SCHEMA  # re-exported: tests build older stores from it

log = logging.getLogger("jupyterlab_mlcluster.store")


# Keep this many change-feed rows; readers further behind resynchronise from a snapshot.
EVENTS_KEPT = 20_000
METRICS_KEPT_SECONDS = 3600.0


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


class UnknownJob(KeyError):
    """No job with that id (or the id is not a valid job id at all)."""

    def __str__(self) -> str:
        return f"no job {self.args[0]!r}"


def check_job_id(job_id: str) -> str:
    """Refuse anything that is not a job id before it gets near a path or a query."""
    if not isinstance(job_id, str) or not JOB_ID_RE.fullmatch(job_id):
        raise UnknownJob(job_id)
    return job_id


# A submission's files are written here, then renamed to jobs/<id> in the transaction that
# inserts its row; one left by a submitter that died in between is removed after this long.
STAGING_PREFIX = ".new-"
STAGING_STALE = 600.0


# Space kept for the store's last words: a file of this size in the store's root that a
# supervisor deletes when its disk is full, so that its job's failure (and its ranks' end)
# can still be written and every reader sees the job end, instead of a job listed running
# until someone frees space. Made again by the next store opened with room for it.
RESERVE_NAME = "reserve"
RESERVE_BYTES = 256 * 1024


class UnsafeStore(PermissionError):
    """A store root someone else owns or may write: opening it would trust their files (the
    jobs' payloads, results and keys). The message says what to do."""


def check_store_root(root: Path) -> None:
    """Refuse a store root this user does not own, or one others may write (a directory an
    attacker made first, where this user's jobs would land; a world-writable one). Its own
    primary group may write it (shared-group homes such as Jupyter's docker stacks)."""
    info = os.stat(root)
    me = os.geteuid()
    if info.st_uid != me:
        raise UnsafeStore(
            f"the job store {root} belongs to uid {info.st_uid}, not to you (uid {me}): its "
            "owner could read and change your jobs. Use a directory of your own "
            "(MLCLUSTER_STORE_DIR or MLClusterConfig.store_dir)"
        )
    loose = info.st_mode & 0o002 or (info.st_mode & 0o020 and info.st_gid != os.getegid())
    if loose:
        raise UnsafeStore(
            f"the job store {root} may be written by other users (mode "
            f"{stat.S_IMODE(info.st_mode):o}): they could change your jobs. `chmod 700 {root}`, "
            "or use a directory of your own (MLCLUSTER_STORE_DIR or MLClusterConfig.store_dir)"
        )


class JobStore:
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
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        check_store_root(self.root)
        (self.root / "jobs").mkdir(exist_ok=True, mode=0o700)
        self.db_path = self.root / "jobs.db"
        self.database = Database(self.db_path)
        self.journal_mode = choose_journal_mode(self.root, journal_mode, mountinfo)
        ensure_schema(self.database, self.root, self.journal_mode)
        self.keep_reserve()

    # -- the reserve -------------------------------------------------------------------

    def keep_reserve(self) -> None:
        """Make the reserve (RESERVE_NAME) if it is missing and there is room; a full disk
        leaves it missing until a later call."""
        path = self.root / RESERVE_NAME
        if self.database.read_only or path.exists():
            return
        # Zeros written, not a sparse file: real blocks, whose deletion gives space back. A
        # full disk leaves neither the reserve nor write_whole's temporary file.
        with contextlib.suppress(OSError):
            write_whole(path, bytes(RESERVE_BYTES), mode=0o600)

    def release_reserve(self) -> bool:
        """Give the reserve's space back (a full disk); True if there was one to give."""
        try:
            (self.root / RESERVE_NAME).unlink()
        except OSError:
            return False
        return True

    # -- connections -------------------------------------------------------------------

    @property
    def _db(self) -> sqlite3.Connection:
        return self.database.connection

    def _tx(self):
        return self.database.transaction()

    def close(self) -> None:
        self.database.close()

    # -- paths -------------------------------------------------------------------------

    def job_dir(self, job_id: str) -> Path:
        return self.root / "jobs" / check_job_id(job_id)

    def read_launch(self, job_id: str) -> dict[str, Any]:
        """The job's launch.json (what its submitter settled: the ranks' environment and
        working directory, its settings); a job stored without one runs with this
        process's environment and directory."""
        try:
            return json.loads((self.job_dir(job_id) / "launch.json").read_text())
        except FileNotFoundError:
            return {"env": dict(os.environ), "cwd": os.getcwd()}

    def tensorboard_dir(self, job_id: str) -> Path:
        """Where a local job's ranks write TensorBoard data by default
        ($MLCLUSTER_TENSORBOARD_DIR, unless the job's env names another)."""
        return self.job_dir(job_id) / "tensorboard"

    def payload_path(self, job_id: str) -> Path:
        return self.job_dir(job_id) / "payload.pkl"

    def result_path(self, job_id: str) -> Path:
        """Rank 0's result pickled: only the owner's kernel or process may load it."""
        return self.job_dir(job_id) / "result.pkl"

    def drop_result(self, job_id: str) -> None:
        """Forget a delivered result: its file(s) (any form of it) and the job's
        has_result, so nothing claims a result that is gone."""
        for path in self.job_dir(job_id).glob("result.*"):
            path.unlink(missing_ok=True)
        self.update_job(job_id, has_result=False)

    def result_json_path(self, job_id: str) -> Path:
        """Rank 0's result as data: its JSON form, or the types that have none (what servers
        read: they never unpickle). Ranks write it beside result_path()."""
        return self.result_path(job_id).with_name("result.json")

    def error_path(self, job_id: str, rank: int) -> Path:
        return self.job_dir(job_id) / f"error-{int(rank)}.json"

    def log_dir(self, job_id: str) -> Path:
        return self.job_dir(job_id) / "logs"

    def log_path(self, job_id: str, rank: int) -> Path:
        return self.log_dir(job_id) / f"rank-{int(rank)}.log"

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

    def remove_stale_staging(self, older_than: float = STAGING_STALE) -> list[str]:
        """Staging directories of submissions whose submitter died before finishing."""
        removed = []
        cutoff = time.time() - older_than
        with contextlib.suppress(OSError):
            for entry in os.scandir(self.root / "jobs"):
                if entry.name.startswith(STAGING_PREFIX):
                    with contextlib.suppress(OSError):
                        if entry.stat(follow_symlinks=False).st_mtime < cutoff:
                            shutil.rmtree(entry.path, ignore_errors=True)
                            removed.append(entry.name)
        return removed

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

    def _page(
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
        db = self._db
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

    def list_jobs(self, **filters: Any) -> tuple[list[JobRecord], int]:
        """Jobs matching every filter given (`owner`: only that user's; see `_page`)."""
        page, total = self._page(**filters)
        return self._with_queue_positions([job_from_row(r, ranks) for r, ranks in page]), total

    def list_json(self, **filters: Any) -> tuple[list[str], int]:
        """`list_jobs`, each job as the JSON text of its JobRecord.to_json(): a job that is
        not queued is rendered from its rows alone, once for the same rows (rows.job_json)."""
        page, total = self._page(**filters)
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
            order_ids = {b: self.queue(b) for b in {r.backend for r in queued}}
            for r in queued:
                with contextlib.suppress(ValueError):
                    r.queue_position = order_ids[r.backend].index(r.id)
        return records

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
        """Latest metrics onto the rank rows and into the history, one transaction."""
        ts = ts or time.time()
        with self._tx() as db:
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
            self._event(db, job_id, Change.METRICS)

    def metrics_history(
        self, job_id: str, since: float | None = None
    ) -> dict[int, list[dict[str, Any]]]:
        check_job_id(job_id)
        rows = self._db.execute(
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

    # -- sessions (jobs/sessions.py) -----------------------------------------------------
    # A session is a long-running job (its "holder": the gang's allocation, supervisor and
    # ranks) plus this row; each cell run in it is a job of its own whose origin names the
    # holder (`session_job`).

    def add_session(self, job_id: str, owner: str | None, name: str) -> str:
        """Record `job_id` as the session `name` of `owner`, unless a live one (its holder
        job not final) already has that name: then that one's holder id is returned and
        nothing is written. Decided in one transaction, so two kernels starting the same
        session at once get one session."""
        finals = [str(s) for s in (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)]
        with self._tx() as db:
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
            self._event(db, job_id, Change.SESSION)
            return job_id

    def session_rows(
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
        rows = self._db.execute(
            "SELECT s.*, j.state AS state, j.reason AS reason, j.error AS error,"
            " j.finished AS finished FROM sessions s JOIN jobs j ON j.id = s.job_id"
            f" WHERE {' AND '.join(where)} ORDER BY s.created DESC",
            args,
        ).fetchall()
        return [dict(r) for r in rows]

    def update_session(self, job_id: str, **fields: Any) -> None:
        allowed = {"cells", "idle_since", "end_reported", "restart_requested"}
        if not fields or set(fields) - allowed:
            raise ValueError(f"session fields are {sorted(allowed)}")
        with self._tx() as db:
            db.execute(
                f"UPDATE sessions SET {', '.join(f'{k} = ?' for k in fields)} WHERE job_id = ?",
                [*fields.values(), job_id],
            )
            self._event(db, job_id, Change.SESSION)

    def session_row(self, job_id: str) -> dict[str, Any] | None:
        row = self._db.execute("SELECT * FROM sessions WHERE job_id = ?", (job_id,)).fetchone()
        return dict(row) if row is not None else None

    def session_cells(self, holder_id: str, states: list[str]) -> list[str]:
        """Ids of the cells of the session `holder_id` in `states`, oldest first."""
        rows = self._db.execute(
            "SELECT id FROM jobs WHERE json_extract(origin, '$.session_job') = ?"
            f" AND state IN ({','.join('?' * len(states))}) ORDER BY created, id",
            [holder_id, *states],
        ).fetchall()
        return [r["id"] for r in rows]

    # -- gang admission ------------------------------------------------------------------

    def queue(self, backend: str = "local") -> list[str]:
        """Queued job ids of a backend in admission order: priority, then submission time."""
        rows = self._db.execute(
            "SELECT id FROM jobs WHERE backend = ? AND state = ? "
            "ORDER BY priority DESC, created, id",
            (backend, str(JobState.QUEUED)),
        ).fetchall()
        return [r["id"] for r in rows]

    def queue_position(self, job_id: str, backend: str) -> int | None:
        try:
            return self.queue(backend).index(job_id)
        except ValueError:
            return None

    def try_admit(self, job_id: str, decide) -> dict[str, Any] | None:
        """Atomically decide whether a queued job may start, and take its resources.

        `decide(job_row, queued_rows_in_order, holding_rows)` runs inside one IMMEDIATE
        transaction (so two supervisors can never both take the same GPUs) and returns
        the allocation dict, or None to keep waiting. On admission the job becomes
        `starting` with the allocation stored.
        """
        with self._tx() as db:
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
            self._event(db, job_id, Change.JOB)
            return allocation

    # -- change feed ---------------------------------------------------------------------

    def notify(self, job_id: str, kind: Change) -> None:
        """A change that lives outside the database (new log lines) -> the change feed."""
        with self._tx() as db:
            self._event(db, job_id, kind)

    def _event(self, db: sqlite3.Connection, job_id: str, kind: Change) -> None:
        cur = db.execute(
            "INSERT INTO events (ts, job_id, kind) VALUES (?, ?, ?)", (time.time(), job_id, kind)
        )
        seq = cur.lastrowid or 0
        if seq % 1000 == 0:
            db.execute("DELETE FROM events WHERE seq <= ?", (seq - EVENTS_KEPT,))

    def last_seq(self) -> int:
        row = self._db.execute("SELECT MAX(seq) FROM events").fetchone()
        return row[0] or 0

    def events_since(self, seq: int, limit: int = 5000) -> list[tuple[int, str, str]]:
        """[(seq, job_id, kind)] after `seq`. If `seq` fell out of the kept window, the
        first element is (-1, '', 'resync'): the reader must take a fresh snapshot."""
        db = self._db
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
        return self._db.execute("PRAGMA data_version").fetchone()[0]

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


# -- the jobs table, for the store file's other tables --------------------------------------
# The experiment store (sweeps, schedules) keeps its tables in this file so that a trial's
# slot and a tick's claim are decided in one transaction with the jobs' states; it asks
# those states here, on its own connection (`db`, inside its transaction), and never writes
# or names the jobs table itself. Ids travel as one JSON array (no bound on their number).

JOB_SUMMARY_FIELDS = ("state", "started", "finished", "error", "reason")


def job_summaries(db: sqlite3.Connection, job_ids: list[str]) -> dict[str, dict[str, Any]]:
    """id -> {state, started, finished, error, reason} of those of `job_ids` still stored."""
    rows = db.execute(
        "SELECT id, state, started, finished, error, reason FROM jobs"
        " WHERE id IN (SELECT value FROM json_each(?))",
        (json.dumps(job_ids),),
    ).fetchall()
    return {row["id"]: {k: row[k] for k in JOB_SUMMARY_FIELDS} for row in rows}


def unfinished_among(db: sqlite3.Connection, job_ids: list[str]) -> list[str]:
    """Those of `job_ids` stored and not final."""
    marks = ",".join("?" * len(FINAL_STATES))
    return [
        row[0]
        for row in db.execute(
            "SELECT id FROM jobs WHERE id IN (SELECT value FROM json_each(?))"
            f" AND state NOT IN ({marks})",
            (json.dumps(job_ids), *(str(s) for s in FINAL_STATES)),
        )
    ]


def sweep_job_ids(db: sqlite3.Connection, sweep_id: str) -> list[str]:
    """Every stored job whose origin says it is a trial of this sweep."""
    rows = db.execute(
        "SELECT id FROM jobs WHERE json_extract(origin, '$.sweep.id') = ?", (sweep_id,)
    ).fetchall()
    return [row[0] for row in rows]
