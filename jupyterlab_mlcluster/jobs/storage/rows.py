"""A job's row and its ranks' rows in the store, and back: the columns a write may set
(JOB_COLUMNS, RANK_COLUMNS), a value as its column holds it (`to_column`: JSON, enum values,
0/1), and a JobRecord from its rows (`job_from_row`)."""

from __future__ import annotations

import functools
import json
import sqlite3
from typing import Any

from ..model import JobSpec, JobState, RankState
from ..record import JobRecord, RankRecord

_JSON_COLUMNS = (
    "origin",
    "supervisor",
    "allocation",
    "capacity",
    "backend_state",
    "stall",
    "straggler",
    "attempts",
    "tracking",
)
JOB_COLUMNS = {
    "name",
    "state",
    "started",
    "finished",
    "error",
    "failed_rank",
    "reason",
    "restarts",
    "cancel_requested",
    "owner",
    "origin",
    "has_result",
    "supervisor",
    "heartbeat",
    "allocation",
    "capacity",
    "backend_state",
    "gpu_idle_since",
    "stall",
    "straggler",
    "attempts",
    "tracking",
}
RANK_COLUMNS = {
    "state",
    "exit_code",
    "pid",
    "process_start",
    "host",
    "started",
    "finished",
    "metrics",
    "progress",
}


def to_column(key: str, value: Any) -> Any:
    if key in _JSON_COLUMNS or key in ("metrics", "progress"):
        return None if value is None else json.dumps(value)
    if isinstance(value, (JobState, RankState)):
        return value.value
    if isinstance(value, bool):
        return int(value)
    return value


def job_from_row(row: sqlite3.Row, rank_rows: list[sqlite3.Row]) -> JobRecord:
    def loads(col: str, default: Any = None) -> Any:
        value = row[col]
        if not value or value == "{}":  # most rows' origin/backend_state: no parse
            return {} if value else default
        return json.loads(value)

    return JobRecord(
        id=row["id"],
        name=row["name"],
        spec=_spec(row["spec"]),
        state=JobState(row["state"]),
        created=row["created"],
        started=row["started"],
        finished=row["finished"],
        error=row["error"],
        failed_rank=row["failed_rank"],
        reason=row["reason"],
        restarts=row["restarts"],
        cancel_requested=bool(row["cancel_requested"]),
        owner=row["owner"],
        origin=loads("origin", {}),
        has_result=bool(row["has_result"]),
        supervisor=loads("supervisor"),
        heartbeat=row["heartbeat"],
        allocation=loads("allocation"),
        capacity=loads("capacity"),
        backend_state=loads("backend_state", {}),
        gpu_idle_since=row["gpu_idle_since"],
        stall=loads("stall"),
        straggler=loads("straggler"),
        attempts=loads("attempts") or [],
        tracking=loads("tracking"),
        updated=row["updated"],
        ranks=[
            RankRecord(
                rank=r["rank"],
                state=RankState(r["state"]),
                exit_code=r["exit_code"],
                pid=r["pid"],
                host=r["host"],
                started=r["started"],
                finished=r["finished"],
                metrics=json.loads(r["metrics"]) if r["metrics"] else {},
                progress=json.loads(r["progress"]) if r["progress"] else None,
            )
            for r in rank_rows
        ],
    )


def _spec(text: str) -> JobSpec:
    """A job's spec from its column. Jobs of a team share a few specs: each text is parsed
    once (GET /jobs reads 100 rows a request); every record still gets its own JobSpec and
    env, since a record's spec may be changed by its holder."""
    spec = JobSpec.from_dict(_spec_fields(text))
    spec.env = dict(spec.env)
    return spec


@functools.lru_cache(maxsize=256)
def _spec_fields(text: str) -> dict[str, Any]:
    return json.loads(text)
