"""Persistence of sweeps and schedules: their own tables, in the job store's SQLite file.

Why the same file (jobs.db) and not a file of its own: the two questions that must be
answered atomically join experiment rows with job rows in ONE transaction —
"may this trial start? (fewer than K of its sweep's trials hold a slot and are not final)"
and "may this tick fire? (claim it; Forbid: no run of this schedule still active)". SQLite
cannot lock two files in one transaction. The tables are created here (CREATE IF NOT
EXISTS) and only this module writes them; jobs/storage/store.py knows nothing of them. The
jobs' side of those questions is asked through the store's own functions (`job_summaries`,
`unfinished_among`, `sweep_job_ids`) on this module's connection, inside its transaction:
no SQL here names the jobs table.

    sweeps         one row per sweep (options, owner)
    sweep_trials   trial index -> job id, params; `admitted` once it holds a parallel slot
    schedules      one row per schedule (cron, policies, job spec); payload in a file
    schedule_runs  one row per claimed tick: PRIMARY KEY (schedule, tick) is the claim
"""

from __future__ import annotations

import contextlib
import enum
import json
import os
import sqlite3
import time
from pathlib import Path
from typing import Any

from ...runtime.atomic import write_whole
from ..model import SpecError
from ..storage.database import Database
from ..storage.store import JobStore, job_summaries, sweep_job_ids, unfinished_among

SCHEMA = """
CREATE TABLE IF NOT EXISTS sweeps (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    owner TEXT,
    created REAL NOT NULL,
    options TEXT NOT NULL,
    origin TEXT NOT NULL DEFAULT '{}'
);
CREATE TABLE IF NOT EXISTS sweep_trials (
    sweep_id TEXT NOT NULL,
    trial INTEGER NOT NULL,
    job_id TEXT NOT NULL UNIQUE,
    params TEXT NOT NULL,
    admitted REAL,
    PRIMARY KEY (sweep_id, trial)
);
CREATE TABLE IF NOT EXISTS schedules (
    name TEXT PRIMARY KEY,
    owner TEXT,
    cron TEXT NOT NULL,
    timezone TEXT NOT NULL,
    concurrency TEXT NOT NULL,
    starting_deadline REAL,
    successful_history INTEGER NOT NULL,
    failed_history INTEGER NOT NULL,
    suspended INTEGER NOT NULL DEFAULT 0,
    spec TEXT NOT NULL,
    origin TEXT NOT NULL DEFAULT '{}',
    created REAL NOT NULL,
    last_tick REAL
);
CREATE TABLE IF NOT EXISTS schedule_runs (
    schedule TEXT NOT NULL,
    tick REAL NOT NULL,
    fired REAL NOT NULL,
    job_id TEXT,
    outcome TEXT NOT NULL,
    PRIMARY KEY (schedule, tick)
);
"""

# A tick claimed this long ago and still 'submitting' was abandoned by a dead scheduler.
SUBMIT_STALE_AFTER = 300.0


class TickClaim(enum.StrEnum):
    """What claiming a schedule's tick found (ExperimentStore.claim_tick)."""

    CLAIMED = "claimed"  # this process fires it: go and submit
    SKIPPED = "skipped"  # Forbid, and a run is still active: recorded as skipped
    TAKEN = "taken"  # another scheduler claimed it, or the schedule is gone, paused or past it


class UnknownSweep(KeyError):
    def __str__(self) -> str:
        return f"no sweep {self.args[0]!r}"


class UnknownSchedule(KeyError):
    def __str__(self) -> str:
        return f"no schedule {self.args[0]!r}"


class ScheduleExists(SpecError):
    """Registering a schedule under a name that is taken: nothing is changed."""


class ExperimentStore:
    def __init__(self, db_path: str | os.PathLike[str], root: str | os.PathLike[str]):
        self.db_path = Path(db_path)
        self.root = Path(root)
        self.database = Database(self.db_path)
        for _ in range(100):
            try:
                self._db.executescript(SCHEMA)
                break
            except sqlite3.OperationalError as exc:  # another process creating it right now
                if "locked" not in str(exc):
                    raise
                time.sleep(0.05)

    @classmethod
    def for_jobs(cls, job_store: JobStore) -> ExperimentStore:
        return cls(job_store.db_path, job_store.root)

    @property
    def _db(self) -> sqlite3.Connection:
        return self.database.connection

    def _tx(self) -> contextlib.AbstractContextManager[sqlite3.Connection]:
        return self.database.transaction()

    # -- sweeps --------------------------------------------------------------------------

    def insert_sweep(
        self, sweep_id: str, name: str, owner: str | None, options: dict, origin: dict
    ) -> None:
        with self._tx() as db:
            db.execute(
                "INSERT INTO sweeps (id, name, owner, created, options, origin) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (sweep_id, name, owner, time.time(), json.dumps(options), json.dumps(origin)),
            )

    def add_trial(self, sweep_id: str, trial: int, job_id: str, params: dict) -> None:
        with self._tx() as db:
            db.execute(
                "INSERT INTO sweep_trials (sweep_id, trial, job_id, params) VALUES (?, ?, ?, ?)",
                (sweep_id, trial, job_id, json.dumps(params, default=repr)),
            )

    def get_sweep(self, sweep_id: str) -> dict[str, Any]:
        row = self._db.execute("SELECT * FROM sweeps WHERE id = ?", (sweep_id,)).fetchone()
        if row is None:
            raise UnknownSweep(sweep_id)
        return _sweep_row(row)

    def list_sweeps(self, owner: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
        if owner is None:
            rows = self._db.execute(
                "SELECT * FROM sweeps ORDER BY created DESC LIMIT ?", (int(limit),)
            ).fetchall()
        else:
            rows = self._db.execute(
                "SELECT * FROM sweeps WHERE owner = ? ORDER BY created DESC LIMIT ?",
                (owner, int(limit)),
            ).fetchall()
        return [_sweep_row(r) for r in rows]

    def trials(self, sweep_id: str) -> list[dict[str, Any]]:
        """The sweep's trials in order, each with its job's state and times (one query, so
        a 1,000-trial table is cheap to redraw); a trial whose job was purged is left out."""
        db = self._db
        rows = db.execute(
            "SELECT trial, job_id, params, admitted FROM sweep_trials"
            " WHERE sweep_id = ? ORDER BY trial",
            (sweep_id,),
        ).fetchall()
        jobs = job_summaries(db, [r["job_id"] for r in rows])
        return [
            dict(r, params=json.loads(r["params"]), **jobs[r["job_id"]])
            for r in rows
            if r["job_id"] in jobs
        ]

    def jobs_of_sweep(self, sweep_id: str) -> list[str]:
        """Every stored job that says it is a trial of this sweep (registered or not yet)."""
        return sweep_job_ids(self._db, sweep_id)

    def try_take_slot(self, sweep_id: str, job_id: str, parallel: int | None) -> str | None:
        """Atomically let a trial start if its sweep has a free slot and no earlier trial is
        still waiting. None on success, else why it waits (for the job's `reason`)."""
        with self._tx() as db:
            me = db.execute(
                "SELECT trial, admitted FROM sweep_trials WHERE sweep_id = ? AND job_id = ?",
                (sweep_id, job_id),
            ).fetchone()
            if me is None:
                return "waiting for its sweep to register it"
            if me["admitted"] is not None:
                return None
            admitted = db.execute(
                "SELECT job_id FROM sweep_trials WHERE sweep_id = ? AND admitted IS NOT NULL",
                (sweep_id,),
            ).fetchall()
            holding = len(unfinished_among(db, [r[0] for r in admitted]))
            waiting = db.execute(
                "SELECT job_id FROM sweep_trials WHERE sweep_id = ? AND trial < ?"
                " AND admitted IS NULL",
                (sweep_id, me["trial"]),
            ).fetchall()
            earlier = len(unfinished_among(db, [r[0] for r in waiting]))
            if parallel is not None and holding >= parallel:
                return f"waiting for a sweep slot ({holding} of {parallel} trials running)"
            if earlier:
                return f"waiting for {earlier} earlier trial(s) of its sweep to start"
            db.execute(
                "UPDATE sweep_trials SET admitted = ? WHERE sweep_id = ? AND job_id = ?",
                (time.time(), sweep_id, job_id),
            )
            return None

    # -- schedules -----------------------------------------------------------------------

    def schedule_dir(self, name: str) -> Path:
        return self.root / "schedules" / name

    def payload_path(self, name: str) -> Path:
        return self.schedule_dir(name) / "payload.pkl"

    def insert_schedule(self, row: dict[str, Any], payload: bytes) -> None:
        """Payload file first (0600, written whole), then the row; a clash leaves nothing."""
        directory = self.schedule_dir(row["name"])
        directory.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        if self._db.execute("SELECT 1 FROM schedules WHERE name = ?", (row["name"],)).fetchone():
            raise ScheduleExists(f"a schedule named {row['name']!r} exists already")
        directory.mkdir(exist_ok=True, mode=0o700)
        write_whole(self.payload_path(row["name"]), payload)
        try:
            with self._tx() as db:
                db.execute(
                    "INSERT INTO schedules (name, owner, cron, timezone, concurrency,"
                    " starting_deadline, successful_history, failed_history, suspended, spec,"
                    " origin, created, last_tick) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        row["name"],
                        row.get("owner"),
                        row["cron"],
                        row["timezone"],
                        row["concurrency"],
                        row.get("starting_deadline"),
                        row["successful_history"],
                        row["failed_history"],
                        int(bool(row.get("suspended"))),
                        json.dumps(row["spec"]),
                        json.dumps(row.get("origin") or {}),
                        row.get("created") or time.time(),
                        row.get("last_tick"),
                    ),
                )
        except sqlite3.IntegrityError:
            raise ScheduleExists(f"a schedule named {row['name']!r} exists already") from None

    def get_schedule(self, name: str) -> dict[str, Any]:
        row = self._db.execute("SELECT * FROM schedules WHERE name = ?", (name,)).fetchone()
        if row is None:
            raise UnknownSchedule(name)
        return _schedule_row(row)

    def list_schedules(self, owner: str | None = None) -> list[dict[str, Any]]:
        if owner is None:
            rows = self._db.execute("SELECT * FROM schedules ORDER BY name").fetchall()
        else:
            rows = self._db.execute(
                "SELECT * FROM schedules WHERE owner = ? ORDER BY name", (owner,)
            ).fetchall()
        return [_schedule_row(r) for r in rows]

    def set_suspended(self, name: str, suspended: bool) -> None:
        with self._tx() as db:
            cur = db.execute(
                "UPDATE schedules SET suspended = ? WHERE name = ?", (int(suspended), name)
            )
            if cur.rowcount == 0:
                raise UnknownSchedule(name)

    def delete_schedule(self, name: str) -> None:
        """The row goes first (no scheduler can fire it after this commits), then its files.
        Its runs' jobs stay: they are ordinary jobs with their own lifetime."""
        with self._tx() as db:
            cur = db.execute("DELETE FROM schedules WHERE name = ?", (name,))
            if cur.rowcount == 0:
                raise UnknownSchedule(name)
            db.execute("DELETE FROM schedule_runs WHERE schedule = ?", (name,))
        directory = self.schedule_dir(name)
        for child in directory.glob("*"):
            with contextlib.suppress(OSError):
                child.unlink()
        with contextlib.suppress(OSError):
            directory.rmdir()

    def claim_tick(
        self, name: str, tick: float, forbid_if_active: bool
    ) -> tuple[TickClaim, list[str]]:
        """Claim one tick of a schedule for this process, exactly once across processes:
        (TickClaim, the schedule's active job ids)."""
        with self._tx() as db:
            row = db.execute(
                "SELECT suspended, last_tick FROM schedules WHERE name = ?", (name,)
            ).fetchone()
            if (
                row is None
                or row["suspended"]
                or (row["last_tick"] is not None and row["last_tick"] >= tick)
            ):
                return TickClaim.TAKEN, []
            runs = db.execute(
                "SELECT job_id FROM schedule_runs WHERE schedule = ? AND job_id IS NOT NULL",
                (name,),
            ).fetchall()
            active = unfinished_among(db, [r[0] for r in runs])
            # A run another scheduler is submitting right now counts as active too (unless
            # that scheduler died mid-submit long ago: its claim must not block forever).
            submitting = db.execute(
                "SELECT COUNT(*) FROM schedule_runs WHERE schedule = ? AND outcome = 'submitting'"
                " AND fired > ?",
                (name, time.time() - SUBMIT_STALE_AFTER),
            ).fetchone()[0]
            busy = bool(active) or submitting > 0
            outcome = TickClaim.SKIPPED if forbid_if_active and busy else TickClaim.CLAIMED
            try:
                db.execute(
                    "INSERT INTO schedule_runs (schedule, tick, fired, job_id, outcome) "
                    "VALUES (?, ?, ?, NULL, ?)",
                    (
                        name,
                        tick,
                        time.time(),
                        "skipped: a run is still active"
                        if outcome == TickClaim.SKIPPED
                        else "submitting",
                    ),
                )
            except sqlite3.IntegrityError:
                return TickClaim.TAKEN, []
            db.execute("UPDATE schedules SET last_tick = ? WHERE name = ?", (tick, name))
            return outcome, active

    def record_run(self, name: str, tick: float, job_id: str | None, outcome: str) -> None:
        with self._tx() as db:
            db.execute(
                "UPDATE schedule_runs SET job_id = ?, outcome = ? WHERE schedule = ? AND tick = ?",
                (job_id, outcome, name, tick),
            )

    def advance(self, name: str, tick: float, outcome: str) -> bool:
        """Record a tick that was not run (missed its starting deadline); False if taken."""
        with self._tx() as db:
            row = db.execute("SELECT last_tick FROM schedules WHERE name = ?", (name,)).fetchone()
            if row is None or (row["last_tick"] is not None and row["last_tick"] >= tick):
                return False
            db.execute(
                "INSERT OR IGNORE INTO schedule_runs (schedule, tick, fired, job_id, outcome) "
                "VALUES (?, ?, ?, NULL, ?)",
                (name, tick, time.time(), outcome),
            )
            db.execute("UPDATE schedules SET last_tick = ? WHERE name = ?", (tick, name))
            return True

    def runs(self, name: str, limit: int | None = None) -> list[dict[str, Any]]:
        db = self._db
        rows = db.execute(
            "SELECT tick, fired, job_id, outcome FROM schedule_runs WHERE schedule = ?"
            " ORDER BY tick DESC" + (f" LIMIT {int(limit)}" if limit else ""),
            (name,),
        ).fetchall()
        jobs = job_summaries(db, [r["job_id"] for r in rows if r["job_id"]])
        return [
            {
                "tick": r["tick"],
                "fired": r["fired"],
                "job_id": r["job_id"],
                "outcome": r["outcome"],
                "state": jobs.get(r["job_id"], {}).get("state"),
            }
            for r in rows
        ]

    def forget_runs(self, name: str, job_ids: list[str]) -> None:
        """History limits: these runs' jobs were deleted; their ticks stay claimed."""
        if not job_ids:
            return
        with self._tx() as db:
            db.executemany(
                "UPDATE schedule_runs SET job_id = NULL, outcome = 'deleted (history limit)'"
                " WHERE schedule = ? AND job_id = ?",
                [(name, j) for j in job_ids],
            )


def _sweep_row(row: sqlite3.Row) -> dict[str, Any]:
    return {
        "id": row["id"],
        "name": row["name"],
        "owner": row["owner"],
        "created": row["created"],
        "options": json.loads(row["options"]),
        "origin": json.loads(row["origin"]),
    }


def _schedule_row(row: sqlite3.Row) -> dict[str, Any]:
    data = dict(row)
    data["suspended"] = bool(data["suspended"])
    data["spec"] = json.loads(data["spec"])
    data["origin"] = json.loads(data["origin"])
    return data
