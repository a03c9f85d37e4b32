"""The live trials table of a `%%distributed --sweep` cell.

One display (HTML table + text twin, the same as the Sweep's repr) updated in place from the
store's change feed, at most MAX_REDRAWS_PER_SECOND; in a terminal IPython, one line per
trial state change instead.
"""

from __future__ import annotations

import asyncio
import time
import uuid

from ..jobs.experiments.sweep import Sweep, format_trials_html, format_trials_text
from ..jobs.model import JobState
from ..jobs.storage.watch import StoreWatcher
from .monitor import POLL_INTERVAL

MAX_REDRAWS_PER_SECOND = 4


class SweepMonitor:
    def __init__(self, sweep: Sweep, *, terminal: bool = False, quiet: bool = False):
        self.sweep = sweep
        self.terminal = terminal
        self.quiet = quiet
        self.display_id = f"mlcluster-sweep-{uuid.uuid4().hex}"
        self.watcher = StoreWatcher(sweep._service.store, set(sweep.job_ids), since=0)
        self.states: dict[str, str] = {}
        self.last_redraw = 0.0
        self.shown = False
        self._pending = False  # a change drawn late (inside the redraw limit)
        self._printed: set[str] = set()  # terminal: trial states already printed

    def _bundle(self) -> dict[str, str]:
        options = self.sweep.info["options"]
        trials = self.sweep.trials
        best = self.sweep.best
        return {
            "text/plain": format_trials_text(self.sweep.id, options, trials, best),
            "text/html": format_trials_html(self.sweep.id, options, trials, best),
        }

    def show(self) -> None:
        if self.quiet:
            return
        if self.terminal:
            print(f"mlcluster sweep {self.sweep.id}: {len(self.sweep.job_ids)} trials", flush=True)
            return
        from IPython.display import display

        display(self._bundle(), raw=True, display_id=self.display_id)
        self.shown = True

    def step(self) -> bool:
        """Redraw if something changed; True once every trial is final."""
        changes = self.watcher.poll()
        trials = None
        if changes.jobs or changes.resync or not self.states:
            trials = self.sweep.trials
            self.states = {t.job_id: t.state for t in trials}
            self._redraw(trials)
        return bool(self.states) and all(JobState(s).final for s in self.states.values())

    def _redraw(self, trials, force: bool = False) -> None:
        if self.quiet:
            return
        if self.terminal:
            for t in trials:
                key = f"{t.job_id}:{t.state}"
                if key not in self._printed:
                    self._printed.add(key)
                    print(f"trial {t.index} {t.params} {t.state} ({t.job_id})", flush=True)
            return
        now = time.monotonic()
        if not force and now - self.last_redraw < 1.0 / MAX_REDRAWS_PER_SECOND:
            self._pending = True
            return
        self._pending = False
        self.last_redraw = now
        from IPython.display import update_display

        update_display(self._bundle(), raw=True, display_id=self.display_id)

    def finish(self) -> None:
        if self.shown:
            self._redraw(self.sweep.trials, force=True)

    def follow_blocking(self) -> None:
        while not self.step():
            time.sleep(POLL_INTERVAL)
            self._catch_up()
            self.sweep._service.reap()
        self.finish()

    async def follow_async(self) -> None:
        while not self.step():
            await asyncio.sleep(POLL_INTERVAL)
            self._catch_up()
            self.sweep._service.reap()
        self.finish()

    def _catch_up(self) -> None:
        """A change that arrived inside the redraw limit is drawn once the limit allows."""
        if self._pending and not self.terminal:
            self._redraw(self.sweep.trials)
