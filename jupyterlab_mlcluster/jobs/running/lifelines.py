"""What a supervisor's job lives on besides its ranks: its store, and the process that
submitted it attached (its end cancels the job).

A supervisor holds its store open: the SQLite connection and the ranks' log files are open
descriptors, so after the store's directory is deleted (a test's temporary store removed, a
user's `rm -rf`) every read and write still succeeds, on files nobody can open again. Nothing
fails, and the supervisor would follow its ranks for as long as they run, for no one. So the
supervisor looks at the store's paths themselves: the store directory, the job's directory
and the database file must still be the very files (device and inode) it started with.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil

if TYPE_CHECKING:
    from ..storage.store import JobStore


class StoreGone(Exception):
    """The supervisor stops without writing its job's last word: its store was removed or
    replaced (nobody can read that word), or it was told to stop (SIGTERM) while a full
    disk kept refusing the word."""


# An O_PATH descriptor holds a path's inode (a number reused at once after a deletion,
# otherwise) and, unlike a readable one, never drops SQLite's POSIX locks when closed.
_HOLD = getattr(os, "O_PATH", os.O_RDONLY) | os.O_CLOEXEC


def _hold(path: Path) -> int | None:
    try:
        return os.open(path, _HOLD)
    except OSError:
        return None


class StoreWatch:
    """A store's paths held as first seen; `gone()` says when one was removed or replaced."""

    def __init__(self, store: JobStore, job_id: str | None) -> None:
        """`job_id`: also that job's directory (None: the store's own paths only)."""
        job_dir = [] if job_id is None else [store.job_dir(job_id)]
        self._paths = [store.root, *job_dir, store.db_path]
        self._held = [_hold(p) for p in self._paths]
        self._gone: str | None = None

    def gone(self) -> str | None:
        """Why the store is no longer the one the job is in (removed, or replaced by
        another at the same path), or None. Once gone it stays gone."""
        if self._gone is None:
            for path, fd in zip(self._paths, self._held, strict=True):
                if fd is None:
                    continue  # (not there at the start: a bad job id, said elsewhere)
                held = os.fstat(fd)
                try:
                    now = os.stat(path)
                except OSError:
                    now = None
                if now is not None and (now.st_dev, now.st_ino) != (held.st_dev, held.st_ino):
                    self._gone = f"the job store was replaced by another ({path})"
                elif now is None or held.st_nlink == 0:
                    self._gone = f"the job store was removed ({path})"
                else:
                    continue
                break
        return self._gone

    def close(self) -> None:
        for fd in self._held:
            if fd is not None:
                os.close(fd)
        self._held = [None] * len(self._held)


def attached_process(origin: dict[str, Any]) -> psutil.Process | None:
    pid, started = origin.get("attach_pid"), origin.get("attach_create_time")
    if not pid:
        return None
    try:
        proc = psutil.Process(pid)
        if started is not None and abs(proc.create_time() - started) > 0.05:
            return _GONE
        return proc
    except psutil.NoSuchProcess:
        return _GONE


class _Gone:
    pid = 0


_GONE: Any = _Gone()


def still_running(proc: Any) -> bool:
    if proc is _GONE:
        return False
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
