"""Following the store's change feed: what changed since I last looked?

A follower that waits between looks is woken the moment a process on this machine changes
what it watches (inotify): by default any write to the store's directory (its database and
journal files), or, for the kernel's monitor, a file appearing in its job's directory (the
supervisor makes ENDED there once the job is final), not a fixed poll interval later: on a
job's critical path that interval was the largest wait left between "the job is final" and
the cell's reply. The interval stays as a backstop (a writer on another host sharing the store
over a network filesystem is not seen by inotify), so a follower is never later than with
polling alone.
"""

from __future__ import annotations

import asyncio
import ctypes
import dataclasses
import functools
import logging
import os
import select
import sys
import threading
import time
import weakref
from pathlib import Path

from .store import Change, JobStore

log = logging.getLogger("jupyterlab_mlcluster.watch")

# <sys/inotify.h>: a file in the directory was written, created or renamed into it.
ENDED = "ended"  # made in a job's directory once its supervisor has made it final
_IN_MODIFY, _IN_MOVED_TO, _IN_CREATE = 0x002, 0x080, 0x100
_IN_NONBLOCK, _IN_CLOEXEC = os.O_NONBLOCK, os.O_CLOEXEC
SETTLE_FIRST = 0.0005
SETTLE_CAP = 0.004


@dataclasses.dataclass
class Changes:
    jobs: set[str] = dataclasses.field(default_factory=set)  # state, ranks, metrics, progress
    logs: set[str] = dataclasses.field(default_factory=set)  # new log lines
    deleted: set[str] = dataclasses.field(default_factory=set)
    resync: bool = False  # fell behind the kept window: reload everything

    def __bool__(self) -> bool:
        return bool(self.jobs or self.logs or self.deleted or self.resync)


class StoreWatcher:
    """Cheap to poll often: one PRAGMA when nothing changed.

    Not thread-safe; give each thread its own (the store hands out per-thread connections).
    """

    def __init__(
        self,
        store: JobStore,
        job_ids: set[str] | None = None,
        since: int | None = None,
        *,
        wake_on: tuple[Path, int] | None = None,
    ):
        """`wake_on`: (directory, WRITES or CREATED) whose change ends a wait(); default any
        write to the store's own directory (every commit)."""
        self.store = store
        self.job_ids = job_ids
        self.seq = store.last_seq() if since is None else since
        self._version: int | None = None
        self._bell: StoreBell | None = None
        self._bell_tried = False
        self._wake_on = wake_on or (store.root, WRITES)

    def _ring(self) -> StoreBell | None:
        if not self._bell_tried:  # made on the first wait: pollers that never wait need none
            self._bell_tried = True
            self._bell = StoreBell.open(*self._wake_on)
        return self._bell

    def wait(self, timeout: float) -> None:
        """Sleep until the store has changed (since the last poll), at most `timeout` s."""
        bell = self._ring()
        if bell is None:
            time.sleep(timeout)
            return
        deadline = time.monotonic() + timeout
        bell.wait(timeout)
        delay = SETTLE_FIRST
        while not self._news() and (left := deadline - time.monotonic()) > 0:
            bell.wait(min(delay, left))
            delay = min(delay * 2, SETTLE_CAP)

    async def wait_async(self, timeout: float) -> None:
        """wait() without blocking the event loop."""
        bell = self._ring()
        if bell is None:
            await asyncio.sleep(timeout)
            return
        deadline = time.monotonic() + timeout
        await bell.wait_async(timeout)
        delay = SETTLE_FIRST
        while not self._news() and (left := deadline - time.monotonic()) > 0:
            await bell.wait_async(min(delay, left))
            delay = min(delay * 2, SETTLE_CAP)

    def _news(self) -> bool:
        """Another connection committed since the last poll. A writer's last write() (what
        woke us) comes a moment before its commit is visible (SQLite then updates its
        shared-memory index, which inotify does not see), and a transaction is several
        writes: after a wake-up without news, look again shortly (SETTLE_FIRST, doubling
        up to SETTLE_CAP) instead of sleeping to the backstop."""
        return self.store.data_version() != self._version

    def close(self) -> None:
        """Let go of the wake-up (wait() sleeps its timeout afterwards)."""
        if self._bell is not None:
            self._bell.release()
            self._bell = None

    def poll(self) -> Changes:
        changes = Changes()
        version = self.store.data_version()
        if version == self._version:
            return changes
        self._version = version
        for seq, job_id, kind in self.store.events_since(self.seq):
            if seq == -1:
                changes.resync = True
                continue
            self.seq = seq
            if self.job_ids is not None and job_id not in self.job_ids:
                continue
            if kind == Change.LOGS:
                changes.logs.add(job_id)
            elif kind == Change.DELETED:
                changes.deleted.add(job_id)
                changes.jobs.discard(job_id)
            elif kind != Change.HEARTBEAT:
                changes.jobs.add(job_id)
        return changes


# Released bells, kept for the next follower (re-aimed at its directory): closing an inotify
# instance waits for the kernel's RCU grace period (7-15 ms measured), which would otherwise
# sit between a job's end and the cell's reply; moving a watch takes microseconds.
_IDLE_BELLS: list[StoreBell] = []
_IDLE_LOCK = threading.Lock()
IDLE_BELLS_KEPT = 2
WRITES = _IN_MODIFY | _IN_MOVED_TO | _IN_CREATE  # any file in the directory written
CREATED = _IN_MOVED_TO | _IN_CREATE  # a file appeared in it (not: one grew)


class StoreBell:
    """Readable when a file in a directory was written (or made: `mask`), by Linux inotify;
    open() gives None where there is none (another system, or this user's inotify instances
    are used up: max_user_instances), and the caller polls."""

    def __init__(self, fd: int):
        self.fd = fd
        self.wd = -1
        self._closer = weakref.finalize(self, os.close, fd)  # a monitor dropped unclosed
        # poll, not select: select() refuses descriptors past FD_SETSIZE (1024), which a
        # long-lived process (a Jupyter server, a kernel) with many sockets reaches. One
        # poller for the bell's life: a follower waits on it every POLL_INTERVAL.
        self._poller = select.poll()
        self._poller.register(fd, select.POLLIN)

    @classmethod
    def open(cls, directory: str | os.PathLike[str], mask: int = WRITES) -> StoreBell | None:
        if not sys.platform.startswith("linux"):
            return None
        with _IDLE_LOCK:
            bell = _IDLE_BELLS.pop() if _IDLE_BELLS else None
        try:
            if bell is None:
                fd = _libc().inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
                if fd < 0:
                    raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
                bell = cls(fd)
            bell._aim(directory, mask)
        except (OSError, AttributeError) as exc:
            log.debug("no inotify on %s (%s): polling", directory, exc)
            if bell is not None:
                bell.release()
            return None
        return bell

    def _aim(self, directory: str | os.PathLike[str], mask: int) -> None:
        self.wd = _libc().inotify_add_watch(self.fd, os.fsencode(Path(directory)), mask)
        if self.wd < 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))
        self.drain()

    def release(self) -> None:
        """Done with it: kept (watching nothing) for the next follower, a few, else closed."""
        if self._closer.alive:
            if self.wd >= 0:
                _libc().inotify_rm_watch(self.fd, self.wd)
                self.wd = -1
            self.drain()
            with _IDLE_LOCK:
                if len(_IDLE_BELLS) < IDLE_BELLS_KEPT:
                    _IDLE_BELLS.append(self)
                    return
        self.close()

    def drain(self) -> None:
        """Forget the events so far (one look at the store covers them all)."""
        try:
            while os.read(self.fd, 65536):
                pass
        except (BlockingIOError, OSError):
            pass

    def wait(self, timeout: float) -> None:
        if self._closer.alive:
            self._poller.poll(max(0.0, timeout) * 1000)
            self.drain()
        else:
            time.sleep(timeout)

    async def wait_async(self, timeout: float) -> None:
        if not self._closer.alive:
            await asyncio.sleep(timeout)
            return
        loop = asyncio.get_running_loop()
        rung = loop.create_future()

        def ring() -> None:
            if not rung.done():
                rung.set_result(None)

        # Not asyncio.wait_for: before Python 3.12 it swallows a cancellation that comes as
        # the awaited future completes (cpython gh-86296), and ipykernel interrupts an async
        # cell by cancelling it: with a store written every second, Ctrl-C was now and then
        # lost and the cell followed its job on. A plain awaited future passes it on.
        loop.add_reader(self.fd, ring)
        timer = loop.call_later(timeout, ring)
        try:
            await rung
        finally:
            timer.cancel()
            loop.remove_reader(self.fd)
        self.drain()

    def close(self) -> None:
        self._closer()


@functools.cache
def _libc() -> ctypes.CDLL:
    """The C library, loaded once: every bell's open, aim and release calls into it."""
    return ctypes.CDLL(None, use_errno=True)
