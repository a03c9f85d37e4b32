"""What the CLI and the kernel both show as text: job and session tables, rank counts, ages,
the session command's answer and the stacks command's. One definition each, so `mlcluster
jobs` and `%distributed_jobs` (and `mlcluster session` and `%distributed_session`, `mlcluster
stacks` and `%distributed_stacks`) never disagree.

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
    now = time.time()
    return text_table([JOBS_HEADER, *(_job_row(r, now) for r in records)])


JOBS_HEADER = ("ID", "NAME", "STATE", "RANKS", "BACKEND", "AGE", "INFO")


def _job_row(r, now: float, indent: str = "") -> tuple[str, ...]:
    info = r.error or r.reason or ""
    if r.stall and str(r.state) == "running":
        info = f"{stall_text(r.stall, now)}; {info}" if info else stall_text(r.stall, now)
    if r.straggler and str(r.state) == "running":
        info = f"{straggler_text(r.straggler)}; {info}" if info else straggler_text(r.straggler)
    if r.restarts and not r.final:
        info = f"{restarts_text(r)}; {info}" if info else restarts_text(r)
    return (
        indent + r.id,
        r.name,
        str(r.state),
        rank_counts(r),
        r.backend,
        format_age(now - r.created),
        info[:60],
    )


def format_job_groups(groups, command: str = "mlcluster jobs") -> str:
    """`mlcluster jobs` (and `%distributed_jobs`, its `command`): each top-level entry
    (jobs/listing.py's Group), its newest children indented under it, and how many more it
    has."""
    now = time.time()
    rows: list[tuple[str, ...]] = [JOBS_HEADER]
    for group in groups:
        if group.head is not None:
            rows.append(_job_row(group.head, now))
        else:
            states: dict[str, int] = {}
            for child in group.children:
                states[str(child.state)] = states.get(str(child.state), 0) + 1
            summary = ", ".join(f"{n} {state}" for state, n in sorted(states.items()))
            rows.append(
                (
                    group.id,
                    group.name,
                    "sweep",
                    "",
                    "",
                    format_age(now - group.newest),
                    f"{group.count} trials" + (f" (newest: {summary})" if summary else ""),
                )
            )
        rows += [_job_row(child, now, "  ") for child in group.children]
        more = group.count - len(group.children)
        if more > 0:
            what = "trials" if group.kind == "sweep" else "cells"
            hint = f"{command} --parent {group.id}"
            rows.append(("  …", f"{more} more {what}", "", "", "", "", hint))
    return text_table(rows)


def stall_text(stall: dict, now: float | None = None) -> str:
    """'STALLED rank 1 for 5m: rank 0: all_reduce ← ...' (the job record's `stall`)."""
    ranks = stall.get("ranks") or []
    since = stall.get("since") or 0.0
    who = f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}"
    where = "; ".join(stall.get("where") or [])
    age = format_age((now or time.time()) - since)
    return f"STALLED {who} for {age}" + (f": {where}" if where else "")


def restarts_text(record) -> str:
    """'restart 1 of 3 (attempt 0: rank 1 was killed by SIGKILL)': a restarted job's gang,
    and why the attempt before it ended (the job record's `attempts`)."""
    text = f"restart {record.restarts} of {record.spec.max_restarts}"
    last = (record.attempts or [{}])[-1]
    return text + (f" (attempt {last['attempt']}: {last['reason']})" if last.get("reason") else "")


def attempt_lines(record) -> list[str]:
    """Each ended attempt of a job that may restart, oldest first: 'attempt 0 (0:42):
    failed: rank 1 was killed by SIGKILL; restarted'; the one running now last."""
    lines = []
    for a in record.attempts or []:
        took = format_elapsed_short((a.get("ended") or 0) - (a.get("started") or 0))
        why = f": {a['reason']}" if a.get("reason") else ""
        lines.append(
            f"attempt {a['attempt']} ({took}): {a['outcome']}{why}"
            + ("; restarted" if a.get("restarted") else "")
        )
    if lines and not record.final:
        lines.append(f"attempt {record.restarts}: {record.state}")
    return lines


def format_elapsed_short(seconds: float) -> str:
    seconds = max(0, int(seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def straggler_text(straggler: dict) -> str:
    """'STRAGGLER rank 2 (1.1 steps/s, median 3.2)' (the job record's `straggler`)."""
    ranks = straggler.get("ranks") or []
    rates = straggler.get("rates") or {}
    who = ", ".join(
        f"{r} ({float(rates[str(r)]):.3g} steps/s)" if str(r) in rates else str(r) for r in ranks
    )
    median = straggler.get("median")
    tail = f", median {float(median):.3g}" if median is not None else ""
    return f"STRAGGLER rank{'s' if len(ranks) > 1 else ''} {who}{tail}"


def stacks_command(
    service, job: str | None, *, rank: int | None = None, native: bool = False, as_json=False
) -> tuple[str, bool]:
    """What `mlcluster stacks` and `%distributed_stacks` print, and whether every rank asked
    for was read. Only the caller's own jobs (another user's is unknown); without `job`, the
    caller's newest running one. SpecError (or UnknownJob) for what cannot be answered."""
    from .jobs import forensics
    from .jobs.owner import current_user

    owner = current_user()
    if job is None:
        running, _ = service.list(states=["running"], owner=owner, limit=1)
        if not running:
            raise SpecError("you have no running job: name one (see the jobs list)")
        record = running[0]
    else:
        record = service.get(job, owner=owner)
    try:
        report = service.stacks(record.id, rank, native)
    except (forensics.NoStacks, forensics.NoSuchRank, forensics.StacksUnavailable) as exc:
        raise SpecError(str(exc)) from None
    if as_json:
        return json.dumps(report.to_json(), indent=2, ensure_ascii=False), report.complete
    return forensics.format_report(report), report.complete


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
