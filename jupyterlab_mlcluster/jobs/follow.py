"""Follow a job until it ends: the one loop every front end uses (JobService.wait and
follow_logs, `mlcluster run`'s attached output, the kernel's monitor, REST's followed logs).

Each step reads the job's record first, then its new log lines: a supervisor drains its
ranks' output before it makes the job final, so lines read after a final record are all
there will be, and the job is done once a step finds it final and reads no more lines.
Between steps the follower waits on the store's change feed (watch.py's StoreWatcher:
woken by inotify the moment a process on this machine commits, or makes a file in the
job's directory with `wake_on`; `backstop` seconds at most) and looks again at once, without
waiting, after a step that read lines (there may be more already). The REST server, which
follows many jobs for many clients, is woken by its one broadcaster instead (`wake`).

A follower that waits also reaps (`reap`: JobService.reap), so a job whose supervisor died
is settled and seen to end; the reaper commits on this thread's own connection, which the
feed does not see, so the record is read again whenever the reap names the job.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

from .record import JobRecord
from .storage.store import JobStore
from .storage.watch import StoreWatcher

# The longest a follower sleeps without looking at the store: the backstop for a writer the
# change feed's wake-up does not see (another host sharing the store over a network
# filesystem); inotify wakes it sooner for any writer on this machine.
BACKSTOP = 0.05


@dataclasses.dataclass
class Step:
    """What one look at the store found: the job's record and the log lines new since the
    last look (in the order read; the last line's `cursor` is where to resume)."""

    record: JobRecord
    lines: list[dict[str, Any]]
    cursor: str | None
    # What the caller made of the lines where it read them (the server: their encoded form,
    # in the executor that ran the step).
    data: Any = None

    @property
    def done(self) -> bool:
        """The job is final and every line of its output has been read."""
        return self.record.final and not self.lines


class JobFollower:
    """Follows one job until it ends. Blocking (store reads, file reads): step() belongs in
    an executor where an event loop must not wait. Not thread-safe (its feed reads the
    store on this thread's connection); give each thread its own.

    `logs`: read the job's output too (rank, cursor, tail and max_bytes as read_logs takes
    them; `tail` for the first read only). `wake_on`: what ends a wait (StoreWatcher's;
    default any commit to the store). `wake`: an event something else sets when the job
    changes (the server's broadcaster): then the follower keeps no feed of its own and reads
    the record and the logs at every step. `reap`: called after each wait; returns the ids
    of the jobs it settled."""

    def __init__(
        self,
        store: JobStore,
        job_id: str,
        *,
        logs: bool = True,
        rank: int | None = None,
        cursor: str | None = None,
        tail: int | None = None,
        max_bytes: int | None = None,
        wake_on: tuple[Path, int] | None = None,
        wake: asyncio.Event | None = None,
        reap: Callable[[], list[str]] | None = None,
        backstop: float = BACKSTOP,
    ):
        self.store = store
        self.job_id = job_id
        self.logs = logs
        self.rank = rank
        self.cursor = cursor
        self._tail = tail
        self._read_kwargs = {} if max_bytes is None else {"max_bytes": max_bytes}
        self.wake = wake
        self.reap = reap
        self.backstop = backstop
        self.feed = None if wake is not None else StoreWatcher(store, {job_id}, wake_on=wake_on)
        self.record: JobRecord | None = None
        self._reread = True  # the record, at the first step and after a reap that names it
        self._more = False  # the last step read lines: look again before waiting

    # -- one look -------------------------------------------------------------------------

    def step(self) -> Step:
        """The record, and the log lines new since the last step. Raises UnknownJob once the
        job is purged."""
        if self.feed is None:
            reread = read_logs = True
        else:
            changes = self.feed.poll()
            if changes.deleted:
                self.store.get_job(self.job_id)  # raises UnknownJob (or it came back)
            reread = self._reread or bool(changes.jobs) or changes.resync
            read_logs = self._more or bool(changes.logs) or changes.resync
        if reread or self.record is None:
            self.record = self.store.get_job(self.job_id)
            self._reread = False
        record = self.record
        lines: list[dict[str, Any]] = []
        # First look, or a final job (whose output is complete): read whatever there is.
        if self.logs and (read_logs or record.final or self.cursor is None):
            lines, self.cursor = self.store.read_logs(
                self.job_id, self.rank, self.cursor, tail=self._tail, **self._read_kwargs
            )
            self._tail = None
        self._more = bool(lines)
        return Step(record, lines, self.cursor)

    # -- between looks --------------------------------------------------------------------

    def wait(self) -> None:
        """Until the job may have changed (at most `backstop` s); at once after lines."""
        if not self._more:
            if self.feed is not None:
                self.feed.wait(self.backstop)
            else:
                time.sleep(self.backstop)
        self._reap()

    async def wait_async(self) -> None:
        """wait() without blocking the event loop (the reap, if any, runs on it)."""
        if not self._more:
            if self.wake is not None:
                await self.wake.wait()
            elif self.feed is not None:
                await self.feed.wait_async(self.backstop)
            else:
                await asyncio.sleep(self.backstop)
        self._reap()

    def _reap(self) -> None:
        if self.reap is not None and self.job_id in self.reap():
            self.changed_here()

    def changed_here(self) -> None:
        """This thread changed the job (a waiting cancel, a reap): its connection's commits
        are not news to the feed, so read the record again at the next step."""
        self._reread = True

    # -- until it ends --------------------------------------------------------------------

    def steps(self, timeout: float | None = None) -> Iterator[Step]:
        """Every step until the job is done (the last one yielded is), or `timeout` s."""
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            while True:
                step = self.step()
                yield step
                if step.done or (deadline is not None and time.monotonic() >= deadline):
                    return
                self.wait()
        finally:
            self.close()

    async def steps_async(
        self, run: Callable[[Callable[[], Step]], Awaitable[Step]] | None = None
    ) -> AsyncIterator[Step]:
        """steps() on an event loop; `run`: how to call the blocking step (an executor's),
        else on the loop itself (a kernel's cell may: the loop is the cell's)."""
        try:
            while True:
                if self.wake is not None:
                    self.wake.clear()  # before the look: a change during it wakes the next wait
                step = await run(self.step) if run is not None else self.step()
                yield step
                if step.done:
                    return
                await self.wait_async()
        finally:
            self.close()

    def until_final(self, timeout: float | None = None) -> JobRecord:
        """Block until the job is final (or `timeout` s); its record, as last read."""
        for step in self.steps(timeout):
            if step.record.final:
                break
        assert self.record is not None
        return self.record

    def close(self) -> None:
        """Let go of the feed's wake-up (idempotent)."""
        if self.feed is not None:
            self.feed.close()

    def __enter__(self) -> JobFollower:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
