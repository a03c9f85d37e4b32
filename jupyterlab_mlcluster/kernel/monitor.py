"""The live job monitor in a cell's output.

One JobMonitor follows one job through the store's change feed and drives two views:
- WidgetView (ipywidgets 8): state, elapsed time, one row per rank (state, CPU, memory,
  GPU, progress), per-rank log tabs, a Cancel button;
- RankOutputs: each rank's printed lines as ONE updating output per rank, prefixed
  `[rank N]`, so nbconvert/nbclient runs and copy-paste keep the output;
and a plain-text status line for frontends without widgets (text/plain of the same
display), or plain printed lines in a terminal IPython. A waiting cell builds the widgets
only once its job has run `widget_delay` seconds; a job over sooner leaves a plain HTML
summary (summary_html) and never opens a comm.
Redraws are coalesced to at most MAX_REDRAWS_PER_SECOND however fast ranks print, and a
rank's whole printed output (up to RANK_OUTPUT_LINES lines, resent whole on each update) at
most every RANK_OUTPUT_INTERVAL seconds while the job runs: the kernel shares the machine with
the ranks, so what it sends per second must not grow with how much they print
(bench/bench_monitor.py).
"""

from __future__ import annotations

import html
import threading
import time
import uuid
from typing import Any

from ..jobs.follow import JobFollower
from ..jobs.log_text import LogText, line_text
from ..jobs.model import JobState
from ..jobs.record import JobRecord
from ..jobs.service import JobService
from ..jobs.storage.store import UnknownJob
from ..jobs.storage.watch import CREATED
from .curves import CurvePanel, Curves

POLL_INTERVAL = 0.05
MAX_REDRAWS_PER_SECOND = 4
RANK_OUTPUT_INTERVAL = 1.0
LOG_TAB_LINES = 200
RANK_OUTPUT_LINES = 2000

STATE_COLORS = {
    "pending": "#9e9e9e",
    "queued": "#757575",
    "starting": "#ef6c00",
    "running": "#1565c0",
    "succeeded": "#2e7d32",
    "failed": "#c62828",
    "cancelled": "#6d4c41",
}


# -- formatting (pure) ------------------------------------------------------------------


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


# -- rank output ---------------------------------------------------------------------------


class RankOutputs:
    """Each rank's lines in one updating display output, `[rank N] ...`."""

    def __init__(self, workers: int, enabled: bool = True):
        self.enabled = enabled
        self.lines: dict[int, list[str]] = {r: [] for r in range(workers)}
        self.texts: dict[int, list[str]] = {r: [] for r in range(workers)}  # as shown
        self.dropped: dict[int, int] = {r: 0 for r in range(workers)}
        self.display_ids = {r: f"mlcluster-rank-{uuid.uuid4().hex}" for r in range(workers)}
        self.shown: set[int] = set()
        self.dirty: set[int] = set()  # ranks with lines not yet in their text output
        self.dirty_tabs: set[int] = set()  # ... not yet in the widget view's log tabs
        self.last_flush = float("-inf")

    def add(self, lines: list[dict[str, Any]]) -> None:
        for line in lines:
            rank = line["rank"]
            self.lines[rank].append(line["line"])
            self.texts[rank].append(line_text(line))  # (our notices without [rank N])
            if len(self.lines[rank]) > RANK_OUTPUT_LINES:
                cut = len(self.lines[rank]) - RANK_OUTPUT_LINES
                del self.lines[rank][:cut]
                del self.texts[rank][:cut]
                self.dropped[rank] += cut
            self.dirty.add(rank)
            self.dirty_tabs.add(rank)

    def text(self, rank: int, job_id: str) -> str:
        head = ""
        if self.dropped[rank]:
            head = (
                f"[rank {rank}] ... {self.dropped[rank]} earlier lines: "
                f"%distributed_logs {job_id} --rank {rank}\n"
            )
        return head + "".join(f"{text}\n" for text in self.texts[rank])

    def flush(self, job_id: str, *, force: bool = False, now: float | None = None) -> set[int]:
        """Show the new lines: at most every RANK_OUTPUT_INTERVAL seconds unless `force`
        (the job's end). The ranks whose output was sent."""
        if not self.enabled:
            self.dirty.clear()
            return set()
        now = time.monotonic() if now is None else now
        if not self.dirty or (not force and now - self.last_flush < RANK_OUTPUT_INTERVAL):
            return set()
        self.last_flush = now
        sent = set(self.dirty)
        from IPython.display import display, update_display

        for rank in sorted(self.dirty):
            bundle = {"text/plain": self.text(rank, job_id).rstrip("\n")}
            if rank in self.shown:
                update_display(bundle, raw=True, display_id=self.display_ids[rank])
            else:
                display(bundle, raw=True, display_id=self.display_ids[rank])
                self.shown.add(rank)
        self.dirty.clear()
        return sent


# -- widgets ---------------------------------------------------------------------------


class WidgetView:
    """The ipywidgets monitor: a header, a rank table, per-rank log tabs, Cancel.

    The rank table is one HTML widget (a GridBox of widgets per cell would open ~20
    comms per rank); its rows carry data-rank/data-state attributes for tools and tests.
    Only changed values are sent to the frontend.
    """

    def __init__(self, record: JobRecord, on_cancel, curves: Curves):
        import ipywidgets as w

        self.job_id = record.id
        workers = record.spec.workers
        self.title = w.HTML(layout=w.Layout(flex="1 1 auto"))
        self.clock = w.HTML(layout=w.Layout(width="auto", margin="0 12px"))
        self.cancel = w.Button(
            description="Cancel",
            icon="stop",
            button_style="danger",
            tooltip="Cancel this job: stop all of its ranks",
            layout=w.Layout(width="auto"),
        )
        self.cancel.on_click(lambda _button: on_cancel())
        self.message = w.HTML()
        self.table = w.HTML()
        header = w.HBox(
            [self.title, self.clock, self.cancel], layout=w.Layout(align_items="center")
        )
        self.logs = [w.HTML() for _ in range(workers)]
        self.tabs = w.Tab(children=self.logs, titles=[f"rank {r}" for r in range(workers)])
        self.curves = CurvePanel(curves)  # (mlc.log's series)
        self.widget = w.VBox(
            [header, self.message, self.table, self.curves.widget, self.tabs],
            layout=w.Layout(border="1px solid var(--jp-border-color2, #ccc)", padding="6px 10px"),
        )
        self.widget.add_class("mlcluster-monitor")

    def update(self, record: JobRecord) -> None:
        self.title.value = title_html(record)
        self.clock.value = (
            f"<span style='opacity:0.75'>elapsed</span> <b>{format_elapsed(elapsed(record))}</b>"
        )
        self.message.value = message_html(record) + attempts_html(record)
        if record.final:
            self.close()
        self.table.value = rank_table(record)

    def update_logs(self, outputs: RankOutputs, ranks: set[int]) -> None:
        for rank in ranks:
            tail = outputs.lines[rank][-LOG_TAB_LINES:]
            body = html.escape("\n".join(tail)) or "<i style='opacity:0.6'>no output yet</i>"
            # column-reverse keeps the view pinned to the newest line as the log grows
            self.logs[rank].value = (
                "<div style='max-height:14em;overflow:auto;display:flex;"
                "flex-direction:column-reverse'>"
                f"<pre style='margin:0;font-size:0.85em;white-space:pre-wrap'>{body}</pre></div>"
            )

    def close(self) -> None:
        """The job is over: nothing left to cancel."""
        self.cancel.disabled = True
        self.cancel.layout.display = "none"


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


# -- the monitor ---------------------------------------------------------------------------


class JobMonitor:
    def __init__(
        self,
        service: JobService,
        job_id: str,
        *,
        widgets: bool = True,
        rank_output: bool = True,
        terminal: bool = False,
        quiet: bool = False,
        widget_delay: float = 0.0,
    ):
        """`widget_delay`: build the widgets only once the job has run that long (a job that
        ends sooner leaves a plain HTML summary). Building them costs the kernel ~20 ms of
        CPU, which would otherwise compete with the ranks starting on a small machine."""
        self.service = service
        self.job_id = job_id
        self.quiet = quiet
        self.terminal = terminal
        self.record = service.store.get_job(job_id)
        # Woken when a file appears in the job's directory (its supervisor makes one once
        # the job is final), not by every write to the store: while the job runs, polling
        # every POLL_INTERVAL costs the kernel less than waking for each log batch.
        self.log_text = LogText()  # (a terminal's plain lines)
        self.follower = JobFollower(
            service.store,
            job_id,
            wake_on=(service.store.job_dir(job_id), CREATED),
            reap=service.reap,
            backstop=POLL_INTERVAL,
        )
        self.outputs = RankOutputs(
            self.record.spec.workers, enabled=rank_output and not terminal and not quiet
        )
        self.view: WidgetView | None = None
        self.curves = Curves(service.store.job_dir(job_id))
        self.status_id = f"mlcluster-status-{uuid.uuid4().hex}"
        self.last_state: str | None = None
        self.last_redraw = 0.0
        self.widgets_to_build = widgets and not terminal and not quiet
        self.widget_delay = widget_delay
        self.shown_at = 0.0

    # -- display ----------------------------------------------------------------------

    def show(self) -> None:
        if self.quiet:
            return
        if self.terminal:
            print(status_line(self.record), flush=True)
            self.last_state = str(self.record.state)
            return
        from IPython.display import display

        self.shown_at = time.monotonic()
        if self.widget_delay <= 0:
            self._build_view()
        display(self._bundle(), raw=True, display_id=self.status_id)
        self.last_state = str(self.record.state)
        self._redraw(force=True)

    def _build_view(self) -> bool:
        """Create the widgets (one attempt); True if this call made them."""
        if self.widgets_to_build:
            self.widgets_to_build = False
            try:
                self.view = WidgetView(self.record, self.request_cancel, self.curves)
            except ImportError:
                return False
            return True
        return False

    def _bundle(self) -> dict[str, Any]:
        bundle: dict[str, Any] = {"text/plain": status_line(self.record)}
        if self.view is not None:
            bundle["application/vnd.jupyter.widget-view+json"] = {
                "version_major": 2,
                "version_minor": 0,
                "model_id": self.view.widget.model_id,
            }
        else:
            self.curves.poll()
            bundle["text/html"] = summary_html(self.record) + self.curves.html()
        return bundle

    def request_cancel(self) -> None:
        """The Cancel button: ask the job to stop; the monitor sees it end."""
        if self.view is not None:
            self.view.cancel.disabled = True
            self.view.cancel.description = "Cancelling…"
        self.service.store.request_cancel(self.job_id, "cancelled by user (the Cancel button)")
        self.service._signal_supervisor(self.service.store.get_job(self.job_id), 15)

    # -- one step ---------------------------------------------------------------------

    def step(self) -> bool:
        """Pull news from the store, redraw if due. True once the job is final and all
        of its output has been shown (or it was purged)."""
        try:
            step = self.follower.step()
        except UnknownJob:
            return True
        self.record = step.record
        if step.lines:
            if self.terminal and not self.quiet:
                for _, text in self.log_text.lines(step.lines):
                    print(text, flush=True)
            self.outputs.add(step.lines)
        self._redraw()
        return step.done

    def _redraw(self, force: bool = False) -> None:
        if self.quiet:
            return
        now = time.monotonic()
        due = force or now - self.last_redraw >= 1.0 / MAX_REDRAWS_PER_SECOND
        state = str(self.record.state)
        if self.terminal:
            if state != self.last_state:
                self.last_state = state
                print(status_line(self.record), flush=True)
            return
        if not due and not self.record.final:
            return
        new_view = (
            not self.record.final
            and now - self.shown_at >= self.widget_delay
            and self._build_view()
        )
        self.last_redraw = now
        if self.view is not None:
            self.view.update(self.record)
            self.view.update_logs(
                self.outputs,
                set(range(len(self.view.logs))) if new_view else set(self.outputs.dirty_tabs),
            )
            self.outputs.dirty_tabs.clear()
            self.view.curves.update(force=force or self.record.final)
        self.outputs.flush(self.job_id, force=force or self.record.final)
        if state != self.last_state or new_view:
            self.last_state = state
            from IPython.display import update_display

            update_display(self._bundle(), raw=True, display_id=self.status_id)

    def finish(self, drain: bool = False) -> None:
        """The final view; `drain`: first show the rest of the job's output (following
        stopped early: the cell was interrupted, and the job has been stopped since)."""
        self.record = self.service.store.get_job(self.job_id)
        while drain:
            lines, self.follower.cursor = self.service.logs(
                self.job_id, cursor=self.follower.cursor
            )
            if not lines:
                break
            if self.terminal and not self.quiet:
                for _, text in self.log_text.lines(lines):
                    print(text, flush=True)
            self.outputs.add(lines)
        self._redraw(force=True)
        if self.view is not None:
            self.view.close()

    # -- following --------------------------------------------------------------------

    def follow_blocking(self) -> JobRecord:
        with self.follower:
            while not self.step():
                self.follower.wait()  # (woken when the job ends)
        self.finish()
        return self.record

    async def follow_async(self) -> JobRecord:
        """Await the job without blocking the kernel's event loop, so widget messages
        (the Cancel button) are handled while the cell runs."""
        with self.follower:
            while not self.step():
                await self.follower.wait_async()  # (woken when the job ends)
        self.finish()
        return self.record

    def follow_in_background(self) -> threading.Thread:
        """--no-wait: keep the widgets current from a thread after the cell returned."""
        self.outputs.enabled = False  # display updates need the cell's parent; widgets don't
        thread = threading.Thread(
            target=self.follow_blocking, name=f"mlcluster-monitor-{self.job_id}", daemon=True
        )
        thread.start()
        return thread
