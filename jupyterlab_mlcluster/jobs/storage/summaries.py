"""The jobs table as the store file's other tables see it.

The experiment store (sweeps, schedules) keeps its tables in this file so that a trial's
slot and a tick's claim are decided in one transaction with the jobs' states; it asks
those states here, on its own connection (`db`, inside its transaction), and never writes
or names the jobs table itself. Ids travel as one JSON array (no bound on their number).
"""

from __future__ import annotations

import json
import sqlite3
from typing import Any

from ..model import FINAL_STATES

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
