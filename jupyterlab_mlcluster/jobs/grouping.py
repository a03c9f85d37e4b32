"""Which job a job is listed under, and what a job without `--name` is called.

A session's cells are listed under the session's gang job, a sweep's trials under the sweep:
their `parent` is that job's id or the sweep's id (`parent_of`); other jobs have none. The
store filters on the same thing in SQL (`PARENT_SQL`, indexed as it is written there:
schema.py `jobs_by_parent`), so a listing of the top level or of one group never reads the
others' rows.

A job without a name is named after what it ran (`default_name`): the notebook and its cell
number (`train-cell7`), a script's or module's stem, a function's name; never a bare `cell`.
"""

from __future__ import annotations

import re
from pathlib import PurePath
from typing import Any

# Written exactly so in the index (schema.py) and in every query that filters on it, or
# SQLite cannot use the index.
PARENT_SQL = "COALESCE(json_extract(origin, '$.session_job'), json_extract(origin, '$.sweep.id'))"
# `parent` filter value for the jobs under no parent (the top level of a grouped list).
TOP_LEVEL = "none"


def parent_of(origin: dict[str, Any]) -> str | None:
    """The id of the job or sweep this job is listed under; None at the top level."""
    session_job = origin.get("session_job")
    if session_job:
        return str(session_job)
    sweep = origin.get("sweep")
    if isinstance(sweep, dict) and sweep.get("id"):
        return str(sweep["id"])
    return None


def slug(text: str, limit: int = 40) -> str:
    """A job-name-safe form of `text` (lowercase letters, digits, '-'); '' if none is left."""
    return re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")[:limit].strip("-")


def default_name(
    kind: str, origin: dict[str, Any], *, filename: str = "", function: Any = None
) -> str:
    """The name of a job submitted without one (`kind`: the payload's kind)."""
    cell = origin.get("cell")
    cell_part = f"cell{cell}" if isinstance(cell, int) and cell > 0 else ""
    if kind in ("script", "module"):
        base = PurePath(filename).stem if kind == "script" else filename.rpartition(".")[2]
    elif kind == "callable" and function is not None:
        base = getattr(function, "__name__", "function")
    elif origin.get("notebook"):
        stem = slug(PurePath(str(origin["notebook"])).stem, 40 - len(cell_part) - 1)
        base = f"{stem}-{cell_part}" if stem and cell_part else (stem or cell_part)
    elif cell_part:
        base = cell_part
    elif origin.get("kind") in ("kernel", "ipython"):
        base = "cell"
    else:
        base = "job"
    return slug(base) or "job"


def cell_label(origin: dict[str, Any]) -> str | None:
    """Where a cell job came from, in words: 'train.ipynb, cell [7]'; None if unknown."""
    cell = origin.get("cell")
    notebook = origin.get("notebook")
    if isinstance(cell, int) and notebook:
        return f"{PurePath(str(notebook)).name}, cell [{cell}]"
    if isinstance(cell, int):
        return f"cell [{cell}]"
    return None
