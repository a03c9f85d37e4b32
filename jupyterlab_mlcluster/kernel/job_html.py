"""A job's record as the monitor shows it: its status line for text-only frontends, the
title, messages and rank table of its widgets, and the plain HTML summary a job over before
its widgets were due leaves (pure: a record in, text out)."""

from __future__ import annotations

import html
import time
from typing import Any

from ..jobs.model import JobState
from ..jobs.record import JobRecord

STATE_COLORS = {
    "pending": "#9e9e9e",
    "queued": "#757575",
    "starting": "#ef6c00",
    "running": "#1565c0",
    "succeeded": "#2e7d32",
    "failed": "#c62828",
    "cancelled": "#6d4c41",
}


def format_bytes(value: float | None) -> str:
    if value is None:
        return "–"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"


def format_elapsed(seconds: float | None) -> str:
    if seconds is None:
        return "–"
    seconds = max(0, int(seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def elapsed(record: JobRecord, now: float | None = None) -> float | None:
    if record.started is None:
        return None
    end = record.finished or now or time.time()
    return end - record.started


def rank_summary(record: JobRecord) -> str:
    counts: dict[str, int] = {}
    for rank in record.ranks:
        counts[str(rank.state)] = counts.get(str(rank.state), 0) + 1
    order = ["running", "starting", "pending", "succeeded", "failed", "cancelled"]
    return ", ".join(f"{counts[s]} {s}" for s in order if s in counts)


def status_line(record: JobRecord) -> str:
    """One line for text-only frontends: 'mlcluster job train (j1a2b3c4d5) running: 4 ranks ...'."""
    parts = [f"mlcluster job {record.name} ({record.id}) {record.state}"]
    parts.append(f"{record.spec.workers} ranks on {record.backend}: {rank_summary(record)}")
    if record.started:
        parts.append(f"elapsed {format_elapsed(elapsed(record))}")
    if record.state == JobState.QUEUED and record.reason:
        parts.append(record.reason)
    if idle_gpus_since(record):
        parts.append(f"GPUs idle since {idle_gpus_since(record)}")
    if record.stall and record.state == JobState.RUNNING:
        from ..presentation import stall_text

        parts.append(stall_text(record.stall))
    if record.straggler and record.state == JobState.RUNNING:
        from ..presentation import straggler_text

        parts.append(straggler_text(record.straggler))
    if record.restarts and not record.final:
        from ..presentation import restarts_text

        parts.append(restarts_text(record))
    if record.tracking:
        parts.append(tracking_text(record.tracking))
    if record.error:
        parts.append(record.error)
    return " | ".join(parts)


def tracking_text(tracking: dict[str, Any]) -> str:
    """'MLflow run <id>: <link>' (or where it is, or why it is not there yet)."""
    run, where = tracking.get("run_id"), tracking.get("url") or tracking.get("uri")
    if tracking.get("state") == "unreachable":
        return f"MLflow unreachable at {tracking.get('uri')}: {tracking.get('message')}"
    return f"MLflow run {run}: {where}" if run else f"MLflow run pending at {where}"


def progress_fraction(progress: dict[str, Any] | None) -> float | None:
    if not progress or not progress.get("total"):
        return None
    try:
        return max(0.0, min(1.0, float(progress["step"]) / float(progress["total"])))
    except (TypeError, ValueError, ZeroDivisionError):
        return None


def badge(state: str) -> str:
    color = STATE_COLORS.get(state, "#616161")
    return (
        f'<span class="mlc-state mlc-state-{state}" style="background:{color};color:#fff;'
        f'border-radius:9px;padding:1px 8px;font-size:0.85em;font-weight:600">{state}</span>'
    )


def idle_gpus_since(record: JobRecord) -> str | None:
    """'14:02:05' (this machine's clock) while the running job is flagged for idle GPUs."""
    if record.state != JobState.RUNNING or record.gpu_idle_since is None:
        return None
    return time.strftime("%H:%M:%S", time.localtime(record.gpu_idle_since))


def tensorboard_button(job_id: str) -> str:
    """The kernel knows neither the server's URL nor its XSRF token: the lab extension
    handles a click on [data-mlcluster-tensorboard] by opening the job's TensorBoard tab
    (its mlcluster:open-tensorboard command), as the sidebar's button does."""
    return (
        "<button type='button' class='mlc-tensorboard' "
        f"data-mlcluster-tensorboard='{html.escape(job_id)}' "
        'title="Open this job\'s TensorBoard (MLCLUSTER_TENSORBOARD_DIR) in a JupyterLab tab" '
        "style='font-size:0.85em;padding:0 8px;margin-left:6px;cursor:pointer;border-radius:3px;"
        "border:1px solid var(--jp-border-color1, #bbb);background:var(--jp-layout-color1, #fff);"
        "color:var(--jp-ui-font-color1, #000)'>TensorBoard</button>"
    )


def title_html(record: JobRecord) -> str:
    idle = idle_gpus_since(record)
    flag = (
        f" <span class='mlc-idle-gpus' title='Every GPU of this job has been nearly unused since"
        f" {idle} (MLClusterConfig.idle_gpu_percent / idle_gpu_after)' style='background:#f9a825;"
        "color:#000;border-radius:9px;padding:1px 8px;font-size:0.85em;font-weight:600'>"
        f"GPUs idle since {idle}</span>"
        if idle
        else ""
    )
    return (
        f"<b>{html.escape(record.name)}</b> <code>{record.id}</code> {badge(str(record.state))}"
        f"{flag} <span style='opacity:0.75'>{record.spec.workers} ranks · {record.backend}</span>"
        f"{tensorboard_button(record.id)}{tracking_html(record.tracking)}"
    )


def tracking_html(tracking: dict[str, Any] | None) -> str:
    """The job's MLflow run: a link to it on a tracking server, else where it is."""
    if not tracking:
        return ""
    url = tracking.get("url")
    if url and url.startswith(("http://", "https://")) and tracking.get("state") != "unreachable":
        return (
            f" <a class='mlc-tracking' href='{html.escape(url)}' target='_blank' "
            "rel='noopener noreferrer'>MLflow run</a>"
        )
    text = html.escape(tracking_text(tracking))
    return f" <span class='mlc-tracking' style='opacity:0.75'>{text}</span>"


def message_html(record: JobRecord) -> str:
    if record.stall and record.state == JobState.RUNNING:
        from ..presentation import stall_text

        return (
            "<span class='mlc-stalled' style='color:#e65100'>"
            f"{html.escape(stall_text(record.stall))}</span> <span style='opacity:0.75'>"
            "(every thread: <code>%distributed_stacks "
            f"{html.escape(record.id)}</code>)</span>"
        )
    if record.straggler and record.state == JobState.RUNNING:
        from ..presentation import straggler_text

        return (
            "<span class='mlc-straggler' style='color:#e65100'>"
            f"{html.escape(straggler_text(record.straggler))}</span>"
        )
    if record.error:
        return f"<span style='color:{STATE_COLORS['failed']}'>{html.escape(record.error)}</span>"
    if record.reason and not record.final:
        return f"<span style='opacity:0.8'>{html.escape(record.reason)}</span>"
    if record.state == JobState.CANCELLED:
        return f"<span style='opacity:0.8'>{html.escape(record.reason or 'cancelled')}</span>"
    return ""


def attempts_html(record: JobRecord) -> str:
    """Each attempt of a restarted job and why it ended (--max-restarts); '' otherwise."""
    from ..presentation import attempt_lines

    lines = attempt_lines(record)
    if not lines:
        return ""
    items = "".join(f"<li>{html.escape(line)}</li>" for line in lines)
    return f"<ul class='mlc-attempts' style='margin:2px 0;padding-left:18px'>{items}</ul>"


def summary_html(record: JobRecord) -> str:
    """The monitor without widgets: what a job that ended before the widgets were due
    leaves in the notebook (plain HTML: no comms, and it renders in a saved notebook)."""
    elapsed_text = format_elapsed(elapsed(record))
    return (
        "<div class='mlcluster-summary' style='border:1px solid var(--jp-border-color2, #ccc);"
        f"padding:6px 10px'><div>{title_html(record)} <span style='opacity:0.75'>· {elapsed_text}"
        f"</span></div><div>{message_html(record)}</div>{attempts_html(record)}"
        f"{rank_table(record)}</div>"
    )


def progress_bar(fraction: float | None, state: str) -> str:
    color = {"failed": STATE_COLORS["failed"], "cancelled": STATE_COLORS["cancelled"]}.get(
        state, "#1e88e5"
    )
    if state == "succeeded":
        fraction, color = 1.0 if fraction is None else fraction, STATE_COLORS["succeeded"]
    width = 0 if fraction is None else round(fraction * 100)
    return (
        "<div style='display:inline-block;vertical-align:middle;width:140px;height:8px;"
        "border-radius:4px;"
        "background:var(--jp-layout-color3, #ddd);overflow:hidden'>"
        f"<div style='width:{width}%;height:100%;background:{color}'></div></div>"
    )


def rank_table(record: JobRecord) -> str:
    has_gpus = record.spec.gpus_per_worker > 0
    heads = (
        ["rank", "state", "CPU", "memory"]
        + (["GPU", "GPU memory"] if has_gpus else [])
        + ["progress"]
    )
    th = "".join(
        f"<th style='text-align:left;padding:2px 10px 2px 0;opacity:0.75'>{h}</th>" for h in heads
    )
    rows = []
    for rank in record.ranks:
        m = rank.metrics or {}
        state = str(rank.state)
        p = rank.progress or {}
        label = ""
        if p.get("step") is not None:
            # Every part comes from the job's code (mlc.progress, a tqdm line): text only.
            desc = f"{p['desc']} " if p.get("desc") else ""
            total = f"/{p['total']}" if p.get("total") else ""
            label = html.escape(f"{desc}{p['step']}{total}")
        cells = [
            f"<code>{rank.rank}</code>",
            badge(state),
            "–" if m.get("cpu_percent") is None or rank.state.final else f"{m['cpu_percent']:.0f}%",
            format_bytes(m.get("memory_bytes")),
        ]
        if has_gpus:
            cells += [
                "–" if m.get("gpu_util") is None else f"{m['gpu_util']:.0f}%",
                format_bytes(m.get("gpu_memory_bytes")),
            ]
        cells.append(
            f"{progress_bar(progress_fraction(rank.progress), state)} "
            f"<span style='font-size:0.85em'>{label}</span>"
        )
        td = "".join(
            f"<td style='padding:2px 10px 2px 0;white-space:nowrap'>{c}</td>" for c in cells
        )
        rows.append(f"<tr class='mlc-rank' data-rank='{rank.rank}' data-state='{state}'>{td}</tr>")
    return (
        "<table class='mlc-ranks' style='border-collapse:collapse;margin:4px 0'>"
        f"<thead><tr>{th}</tr></thead><tbody>{''.join(rows)}</tbody></table>"
    )
