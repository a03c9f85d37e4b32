"""%distributed_jobs output: an HTML table with a text/plain twin."""

from __future__ import annotations

import html
import time
from typing import Any

from ..presentation import format_age, format_jobs_table, rank_counts
from .monitor import badge


def jobs_bundle(records, total: int) -> dict[str, Any]:
    now = time.time()
    rows = []
    for r in records:
        info = html.escape((r.error or r.reason or "")[:80])
        rows.append(
            f"<tr><td><code>{r.id}</code></td><td>{html.escape(r.name)}</td><td>{badge(str(r.state))}</td>"
            f"<td>{rank_counts(r)}</td><td>{r.backend}</td><td>{format_age(now - r.created)}</td>"
            f"<td style='text-align:left'>{info}</td></tr>"
        )
    more = (
        f"<p>{total - len(records)} older jobs not shown (--limit).</p>"
        if total > len(records)
        else ""
    )
    table = (
        "<table class='mlcluster-jobs'><thead><tr><th>id</th><th>name</th><th>state</th>"
        "<th>ranks</th>"
        "<th>backend</th><th>age</th><th>info</th></tr></thead><tbody>"
        + "".join(rows)
        + "</tbody></table>"
        + more
    )
    text = format_jobs_table(records) if records else "no jobs"
    return {
        "text/html": table if records else "<p>No distributed jobs yet.</p>",
        "text/plain": text,
    }
