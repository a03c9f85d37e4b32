"""The job store's schema: its tables (SCHEMA), bringing a store written by an older version
up to it (`_migrate`), and SQLite's journal mode (WAL, or the rollback journal on a network
filesystem). Run once when a JobStore opens (jobs/storage/store.py)."""

from __future__ import annotations

import logging
import os
import sqlite3
import time
from pathlib import Path

from . import fsinfo
from .database import Database

log = logging.getLogger("jupyterlab_mlcluster.store")

SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    state TEXT NOT NULL,
    backend TEXT NOT NULL,
    priority INTEGER NOT NULL DEFAULT 0,
    spec TEXT NOT NULL,
    created REAL NOT NULL,
    started REAL,
    finished REAL,
    error TEXT,
    failed_rank INTEGER,
    reason TEXT,
    restarts INTEGER NOT NULL DEFAULT 0,
    cancel_requested INTEGER NOT NULL DEFAULT 0,
    owner TEXT,
    origin TEXT NOT NULL DEFAULT '{}',
    has_result INTEGER NOT NULL DEFAULT 0,
    supervisor TEXT,
    heartbeat REAL,
    allocation TEXT,
    capacity TEXT,
    backend_state TEXT NOT NULL DEFAULT '{}',
    gpu_idle_since REAL,
    stall TEXT,
    straggler TEXT,
    attempts TEXT,
    tracking TEXT,
    updated REAL NOT NULL,
    version INTEGER NOT NULL DEFAULT 0
);
-- A listing's order (newest first, then id), with or without a state or owner filter, and
-- a backend's queue in admission order: read from these in order, never a sort of every
-- matching row (JobStore.list_jobs, JobStore.queue).
CREATE INDEX IF NOT EXISTS jobs_newest ON jobs(created DESC, id);
CREATE INDEX IF NOT EXISTS jobs_newest_by_state ON jobs(state, created DESC, id);
CREATE INDEX IF NOT EXISTS jobs_newest_by_owner ON jobs(owner, created DESC, id);
-- A grouped listing: the top level (no parent) or one group (a session's cells, a sweep's
-- trials), newest first. The expression is jobs/grouping.py's PARENT_SQL, word for word.
CREATE INDEX IF NOT EXISTS jobs_by_parent ON jobs(
    COALESCE(json_extract(origin, '$.session_job'), json_extract(origin, '$.sweep.id')),
    created DESC, id);
CREATE INDEX IF NOT EXISTS jobs_queue ON jobs(state, backend, priority DESC, created, id);
-- What the reaper reads every second: the few unfinished jobs and the few with a cleanup
-- to do, not a scan of every job ever kept. A query names these terms literally, as here,
-- or SQLite cannot use the index.
CREATE INDEX IF NOT EXISTS jobs_unfinished ON jobs(state)
    WHERE state NOT IN ('succeeded', 'failed', 'cancelled');
CREATE INDEX IF NOT EXISTS jobs_cleanup_pending ON jobs(id)
    WHERE json_extract(backend_state, '$.pending_cleanup') IS NOT NULL;
-- Both led by what the indexes above lead with.
DROP INDEX IF EXISTS jobs_by_created;
DROP INDEX IF EXISTS jobs_by_state;
CREATE TABLE IF NOT EXISTS ranks (
    job_id TEXT NOT NULL,
    rank INTEGER NOT NULL,
    state TEXT NOT NULL,
    exit_code INTEGER,
    pid INTEGER,
    process_start REAL,
    host TEXT,
    started REAL,
    finished REAL,
    metrics TEXT NOT NULL DEFAULT '{}',
    progress TEXT,
    PRIMARY KEY (job_id, rank)
);
CREATE TABLE IF NOT EXISTS metrics (
    job_id TEXT NOT NULL,
    rank INTEGER NOT NULL,
    ts REAL NOT NULL,
    cpu_percent REAL,
    memory_bytes INTEGER,
    gpu_util REAL,
    gpu_memory_bytes INTEGER
);
CREATE INDEX IF NOT EXISTS metrics_by_job ON metrics(job_id, rank, ts);
CREATE TABLE IF NOT EXISTS sessions (
    job_id TEXT PRIMARY KEY,
    owner TEXT,
    name TEXT NOT NULL,
    created REAL NOT NULL,
    cells INTEGER NOT NULL DEFAULT 0,
    idle_since REAL,
    end_reported INTEGER NOT NULL DEFAULT 0,
    restart_requested INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS sessions_by_name ON sessions(owner, name, created);
CREATE TABLE IF NOT EXISTS events (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    ts REAL NOT NULL,
    job_id TEXT NOT NULL,
    kind TEXT NOT NULL
);
"""

# A job's `version` is set anew by every write of its row or its ranks' rows, whoever writes
# (another process, an older version of this code): what GET /jobs's rendered JSON is
# remembered by (pages.JobPages), without reading or hashing the rows. Versions come from one
# counter of the store, so a job purged and stored again under its id never has a version
# it had before; the counter starts at random, so a store made again in place of another
# does not repeat the versions of the one it replaces. Made in _migrate's transaction with
# the column: a store has all of it or none (pages.JobPages caches only with all of it).
# The jobs trigger leaves alone only its own write and the ranks triggers' (their version is
# the counter's; recursive triggers are off, SQLite's default, and its WHEN holds either
# way); a write that sets `version` itself to anything else is given a new one too.
_NEW_VERSION = (
    "UPDATE job_versions SET n = n + 1; UPDATE jobs SET version = (SELECT n FROM job_versions)"
)
VERSION_COUNTER = "job_versions"
VERSION_TRIGGERS = {
    "jobs_version_insert": f"AFTER INSERT ON jobs BEGIN {_NEW_VERSION} WHERE id = NEW.id; END",
    "jobs_version_job": (
        "AFTER UPDATE ON jobs WHEN NEW.version IS OLD.version"
        " OR NEW.version IS NOT (SELECT n FROM job_versions)"
        f" BEGIN {_NEW_VERSION} WHERE id = NEW.id; END"
    ),
    "jobs_version_rank_insert": (
        f"AFTER INSERT ON ranks BEGIN {_NEW_VERSION} WHERE id = NEW.job_id; END"
    ),
    "jobs_version_rank_update": (
        f"AFTER UPDATE ON ranks BEGIN {_NEW_VERSION} WHERE id IN (NEW.job_id, OLD.job_id); END"
    ),
    "jobs_version_rank_delete": (
        f"AFTER DELETE ON ranks BEGIN {_NEW_VERSION} WHERE id = OLD.job_id; END"
    ),
}


JOURNAL_MODES = ("auto", "wal", "delete")

_said_journal: set[str] = set()  # stores whose journal mode this process has logged


def choose_journal_mode(root: Path, setting: str, mountinfo: str | os.PathLike[str] | None) -> str:
    """WAL (readers never wait for writers) unless the store is on a network filesystem,
    where SQLite's shared-memory WAL index is unsafe: there the rollback journal."""
    if setting != "auto":
        return setting
    mount = fsinfo.mount_of(root, fsinfo.read_mountinfo(mountinfo))
    if mount is None or not mount.network:
        return "wal"
    key = str(root.resolve())
    if key not in _said_journal:
        _said_journal.add(key)
        log.warning(
            "the job store %s is on a network filesystem (%s %s at %s): using SQLite's"
            " rollback journal (journal_mode=DELETE), not WAL, which is unsafe there",
            root,
            mount.fstype,
            mount.source,
            mount.mount_point,
        )
    return "delete"


def ensure_schema(database: Database, root: Path, journal_mode: str) -> None:
    """Create the tables (and bring an older store up to date) unless they exist; set the
    journal mode. Several processes may open a new store at once."""
    db = database.connection
    if database.read_only:
        return  # a full disk: the store can be read as it is, nothing can be set up
    for _ in range(50):
        try:
            _set_journal_mode(db, root, journal_mode)
            # WAL: NORMAL is durable against process crashes; the rollback journal needs
            # FULL to be so.
            sync = "NORMAL" if journal_mode == "wal" else "FULL"
            db.execute(f"PRAGMA synchronous = {sync}")
            db.executescript(SCHEMA)
            _migrate(database)
            return
        except sqlite3.OperationalError as exc:  # another process creating it right now
            if "locked" not in str(exc):
                raise
            time.sleep(0.05)
    raise RuntimeError(f"job store {database.path} stays locked")


def _set_journal_mode(db: sqlite3.Connection, root: Path, journal_mode: str) -> None:
    """Leaving WAL needs every other connection closed: while another process has the
    store open it stays as it is (said once), rather than waiting for it."""
    db.execute("PRAGMA busy_timeout = 1000")
    try:
        mode = db.execute(f"PRAGMA journal_mode = {journal_mode.upper()}").fetchone()[0]
    except sqlite3.OperationalError as exc:
        if "locked" not in str(exc):
            raise
        mode = db.execute("PRAGMA journal_mode").fetchone()[0]
    finally:
        db.execute("PRAGMA busy_timeout = 30000")
    key = f"{root.resolve()}:{mode}"
    if mode != journal_mode and key not in _said_journal:
        _said_journal.add(key)
        log.warning(
            "the job store %s stays in journal mode %s (%s wanted) while another process"
            " has it open",
            root,
            mode,
            journal_mode,
        )


def _migrate(database: Database) -> None:
    """Bring a store written by an older version up to this schema.

    Judged by the columns themselves, not PRAGMA user_version: jobs.db is shared with
    ExperimentStore, so one version number would have to speak for both."""
    with database.transaction() as tx:
        columns = {row["name"] for row in tx.execute("PRAGMA table_info(ranks)")}
        if "pgid" in columns:
            # It always held the rank's process start time (pid + start time name a
            # process), never a process group id.
            tx.execute("ALTER TABLE ranks RENAME COLUMN pgid TO process_start")
        jobs = {row["name"] for row in tx.execute("PRAGMA table_info(jobs)")}
        if "gpu_idle_since" not in jobs:
            tx.execute("ALTER TABLE jobs ADD COLUMN gpu_idle_since REAL")
        if "stall" not in jobs:
            tx.execute("ALTER TABLE jobs ADD COLUMN stall TEXT")
        if "straggler" not in jobs:
            tx.execute("ALTER TABLE jobs ADD COLUMN straggler TEXT")
        if "attempts" not in jobs:
            tx.execute("ALTER TABLE jobs ADD COLUMN attempts TEXT")
        if "tracking" not in jobs:
            tx.execute("ALTER TABLE jobs ADD COLUMN tracking TEXT")
        if "version" not in jobs:
            tx.execute("ALTER TABLE jobs ADD COLUMN version INTEGER NOT NULL DEFAULT 0")
        tx.execute(
            f"CREATE TABLE IF NOT EXISTS {VERSION_COUNTER}"
            " (one INTEGER PRIMARY KEY CHECK (one = 1), n INTEGER NOT NULL)"
        )
        tx.execute(
            f"INSERT OR IGNORE INTO {VERSION_COUNTER} VALUES (1, random() & 0x3fffffffffffffff)"
        )
        # A trigger as an earlier version defined it is made again as this one does.
        made = dict(tx.execute("SELECT name, sql FROM sqlite_master WHERE type = 'trigger'"))
        for name, body in VERSION_TRIGGERS.items():
            wanted = f"CREATE TRIGGER {name} {body}"
            if made.get(name) != wanted:
                tx.execute(f"DROP TRIGGER IF EXISTS {name}")
                tx.execute(wanted)
