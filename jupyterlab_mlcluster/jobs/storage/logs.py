"""Reading a job's rank logs (jobs/<id>/logs/rank-<r>.log, written by jobs/storage/logfiles.py's
writers) from a cursor: whole lines only, ranks merged by time, a byte budget, a tail.
`JobStore.read_logs` is this."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from . import logfiles

if TYPE_CHECKING:
    from .store import JobStore


def read_logs(
    store: JobStore,
    job_id: str,
    rank: int | None = None,
    cursor: str | None = None,
    *,
    max_bytes: int = 4 * 1024 * 1024,
    tail: int | None = None,
) -> tuple[list[dict[str, Any]], str]:
    """Log lines after `cursor` ('rank:offset,...'); returns (lines, next cursor).

    Lines of several ranks are merged by time. `tail` keeps only the last N lines
    of each rank (used for monitors attaching late).
    """
    record = store.get_job(job_id)
    ranks = [rank] if rank is not None else list(range(record.spec.workers))
    if rank is not None and not 0 <= rank < record.spec.workers:
        raise ValueError(f"rank must be between 0 and {record.spec.workers - 1}, got {rank}")
    offsets = logfiles.parse_cursor(cursor)
    lines: list[dict[str, Any]] = []
    budget = max(1, max_bytes // max(1, len(ranks)))
    for r in ranks:
        path = store.log_path(job_id, r)
        start = offsets.get(r, 0)
        try:
            with open(path, "rb") as f:
                if tail is not None and start == 0:
                    start = logfiles.tail_offset(f, tail)
                # Nothing after an offset at or past the end. Not seeked to: past the file
                # system's largest file (ext4: 16 TiB) lseek fails (EINVAL), and a cursor is
                # the caller's say (a REST query's offset may have 18 digits).
                if start < os.fstat(f.fileno()).st_size:
                    f.seek(start)
                    chunk = f.read(budget)
                else:
                    chunk = b""
        except FileNotFoundError:
            chunk = b""
        # Only whole lines: a writer may be mid-line.
        end = chunk.rfind(b"\n") + 1
        for raw in chunk[:end].splitlines():
            parsed = logfiles.parse_log_line(raw, r)
            if parsed is not None:
                lines.append(parsed)
        offsets[r] = start + end
    lines.sort(key=lambda item: item["_ts"])
    for item in lines:
        item["ts"] = logfiles.iso_us(item.pop("_ts"))
    return lines, logfiles.format_cursor(offsets)
