"""The stacks a job keeps (taken when it stalled, or at its end before its ranks were
stopped): `stacks.json` in the job's directory, the latest KEPT reports, so a finished job
still says where its ranks were."""

from __future__ import annotations

import json
from pathlib import Path

from ...runtime.atomic import write_whole
from .stacks import StackReport

KEPT = 8
FILE = "stacks.json"


def keep(job_dir: Path, report: StackReport) -> None:
    """Add `report` to the job's kept stacks (written whole or not at all)."""
    reports = [r.to_json() for r in kept(job_dir)][-(KEPT - 1) :]
    data = report.to_json()
    data["live"] = False
    reports.append(data)
    write_whole(job_dir / FILE, json.dumps(reports))


def kept(job_dir: Path) -> list[StackReport]:
    """The job's kept reports, oldest first ([] when none or unreadable)."""
    try:
        data = json.loads((job_dir / FILE).read_text())
        return [StackReport.from_json(r) for r in data]
    except (OSError, ValueError, KeyError, TypeError):
        return []
