"""What the CLI and the kernel both show as text: job and session tables, rank counts, ages,
and the session command's answer. One definition each, so `mlcluster jobs` and
`%distributed_jobs` (and `mlcluster session` and `%distributed_session`) never disagree.

A layer of its own under the front ends: it reads the engine (jobs/), and neither front end
imports the other.
"""

from __future__ import annotations

import json
import time

from .jobs.model import SpecError


def text_table(rows) -> str:
    """Rows of cells as left-aligned columns two spaces apart (the first row is the header)."""
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=False)).rstrip()
        for row in rows
    )


def format_jobs_table(records) -> str:
    rows = [("ID", "NAME", "STATE", "RANKS", "BACKEND", "AGE", "INFO")]
    now = time.time()
    for r in records:
        info = r.error or r.reason or ""
        rows.append(
            (
                r.id,
                r.name,
                str(r.state),
                rank_counts(r),
                r.backend,
                format_age(now - r.created),
                info[:60],
            )
        )
    return text_table(rows)


def rank_counts(record) -> str:
    """'4/4 running', '3/4 succeeded, 1 failed': how the ranks stand, briefly."""
    counts: dict[str, int] = {}
    for rank in record.ranks:
        counts[str(rank.state)] = counts.get(str(rank.state), 0) + 1
    if not counts:
        return "0"
    ordered = sorted(counts.items(), key=lambda kv: -kv[1])
    head, *rest = ordered
    text = f"{head[1]}/{record.spec.workers} {head[0]}"
    return ", ".join([text, *(f"{n} {state}" for state, n in rest)])


def format_age(seconds: float) -> str:
    seconds = max(0, int(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m"
    if seconds < 86400:
        return f"{seconds // 3600}h"
    return f"{seconds // 86400}d"


def session_command(service, action: str, name: str | None, *, as_json: bool = False) -> str:
    """What `mlcluster session` and `%distributed_session` print (SpecError: bad use)."""
    from .jobs import sessions
    from .jobs.owner import current_user

    owner = current_user()
    if action == "list":
        if name:
            raise SpecError("session list takes no name")
        infos = sessions.list_sessions(service, owner)
        if as_json:
            return json.dumps([info.to_json() for info in infos], indent=2)
        return format_sessions_table(infos) if infos else "no live sessions"
    if not name:
        raise SpecError(f"session {action} needs the session's name")
    if action == "stop":
        info = sessions.stop_session(service, owner, name)
        return f"session {name} stopped ({info.holder.state})"
    if action == "restart":
        info = sessions.restart_session(service, owner, name)
        return f"session {name} restarted (fresh ranks, restart {info.holder.restarts})"
    raise SpecError(f"unknown session action {action!r}: list, stop or restart")


def format_sessions_table(infos) -> str:
    rows = [("NAME", "STATE", "RANKS", "GPUS", "MEMORY", "CELLS", "IDLE", "AGE", "INFO")]
    now = time.time()
    for info in infos:
        view = info.to_json()
        memory = view["memory_bytes"]
        rows.append(
            (
                info.name,
                view["state"],
                rank_counts(info.holder),
                str(view["gpus"]),
                f"{memory / 2**20:.0f}Mi" if memory else "-",
                str(info.cells),
                format_age(now - info.idle_since) if info.idle_since and info.live else "-",
                format_age(now - info.created),
                (view["reason"] or "")[:60],
            )
        )
    return text_table(rows)
