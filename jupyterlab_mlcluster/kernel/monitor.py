"""The live job monitor in a cell's output.

One JobMonitor follows one job through the store's change feed and drives two views:
- WidgetView (ipywidgets 8): state, elapsed time, one row per rank (state, CPU, memory,
  GPU, progress), per-rank log tabs, a Cancel button;
- RankOutputs: each rank's printed lines as ONE updating output per rank, prefixed
  `[rank N]`, so nbconvert/nbclient runs and copy-paste keep the output;
and a plain-text status line for frontends without widgets (text/plain of the same
display), or plain printed lines in a terminal IPython. A waiting cell builds the widgets
only once its job has run `widget_delay` seconds; a job over sooner leaves a plain HTML
summary (job_html.py draws what both show) and never opens a comm.
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
from ..jobs.record import JobRecord
from ..jobs.service import JobService
from ..jobs.storage.store import UnknownJob
from ..jobs.storage.watch import CREATED
from .curves import CurvePanel, Curves
from .job_html import (
    attempts_html,
    elapsed,
    format_elapsed,
    message_html,
    rank_table,
    status_line,
    summary_html,
    title_html,
)

POLL_INTERVAL = 0.05
MAX_REDRAWS_PER_SECOND = 4
RANK_OUTPUT_INTERVAL = 1.0
LOG_TAB_LINES = 200
RANK_OUTPUT_LINES = 2000


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
