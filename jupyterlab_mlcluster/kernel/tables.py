"""%distributed_jobs output: an HTML table with a text/plain twin; grouped as `mlcluster jobs`
lists (jobs/listing.py: a session's cells under it, a sweep's trials under the sweep), or
flat."""

from __future__ import annotations

import html
import time
from typing import Any

from ..presentation import format_age, format_job_groups, format_jobs_table, rank_counts
from .job_html import badge

COMMAND = "%distributed_jobs"  # what a group's "… N more" row says to run for the rest
HEADER = (
    "<table class='mlcluster-jobs'><thead><tr><th>id</th><th>name</th><th>state</th>"
    "<th>ranks</th><th>backend</th><th>age</th><th>info</th></tr></thead><tbody>"
)
CHILD = " style='padding-left:1.5em'"  # a cell's or trial's id, under its group's


def _row(r, now: float, child: bool = False) -> str:
    info = html.escape((r.error or r.reason or "")[:80])
    return (
        f"<tr><td{CHILD if child else ''}><code>{r.id}</code></td><td>{html.escape(r.name)}</td>"
        f"<td>{badge(str(r.state))}</td><td>{rank_counts(r)}</td><td>{r.backend}</td>"
        f"<td>{format_age(now - r.created)}</td><td style='text-align:left'>{info}</td></tr>"
    )


def jobs_bundle(records, total: int) -> dict[str, Any]:
    now = time.time()
    rows = [_row(r, now) for r in records]
    more = (
        f"<p>{total - len(records)} older jobs not shown (--limit).</p>"
        if total > len(records)
        else ""
    )
    table = HEADER + "".join(rows) + "</tbody></table>" + more
    text = format_jobs_table(records) if records else "no jobs"
    return {
        "text/html": table if records else "<p>No distributed jobs yet.</p>",
        "text/plain": text,
    }


def groups_bundle(groups, total: int) -> dict[str, Any]:
    """The grouped listing (jobs/listing.grouped_jobs' entries, `total` top-level jobs)."""
    if not groups:
        return {"text/html": "<p>No distributed jobs yet.</p>", "text/plain": "no jobs"}
    now = time.time()
    rows = []
    for group in groups:
        if group.head is not None:
            rows.append(_row(group.head, now))
        else:
            rows.append(
                f"<tr class='mlcluster-group'><td><code>{html.escape(group.id)}</code></td>"
                f"<td>{html.escape(group.name)}</td><td>sweep</td><td></td><td></td>"
                f"<td>{format_age(now - group.newest)}</td>"
                f"<td style='text-align:left'>{group.count} trials</td></tr>"
            )
        rows += [_row(child, now, child=True) for child in group.children]
        more = group.count - len(group.children)
        if more > 0:
            what = "trials" if group.kind == "sweep" else "cells"
            rows.append(
                f"<tr><td{CHILD}>…</td><td colspan='6' style='text-align:left'>{more} more "
                f"{what}: <code>{COMMAND} --parent {html.escape(group.id)}</code></td></tr>"
            )
    shown = sum(1 for g in groups if g.head is not None)
    more = (
        f"<p>{total - shown} older jobs not shown (--limit; --flat: every row).</p>"
        if total > shown
        else ""
    )
    text = format_job_groups(groups, command=COMMAND)
    return {"text/html": HEADER + "".join(rows) + "</tbody></table>" + more, "text/plain": text}
