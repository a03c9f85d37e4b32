"""A job's log files, as its supervisor writes them: each rank's lines, timestamped, within
the job's log cap, with a change-feed nudge for readers at most every LOG_EVENT_INTERVAL."""

from __future__ import annotations

import contextlib
import os
import time

from ..storage.logfiles import format_log_line
from ..storage.store import Change, JobStore

LOG_EVENT_INTERVAL = 0.05


class LogWriter:
    """Appends timestamped lines to each rank's log file; tells readers there is news.

    A job's ranks' output (stdout and stderr) is kept up to `max_bytes` in all (0: no cap;
    MLClusterConfig.max_log_mib): the store's disk is every job's. Past it, one system line
    in each rank's file says the log was truncated, and further output is dropped while the
    job goes on; our own system lines (restarts, kills, the outcome) are still written."""

    def __init__(self, store: JobStore, job_id: str, workers: int, max_bytes: int = 0):
        self._store = store
        self._job_id = job_id
        self._files = {
            # Open for the writer's life, closed by close(): not a with block.
            r: open(store.log_path(job_id, r), "ab", buffering=0)
            for r in range(workers)
        }
        self._dirty = False
        self._last_notify = 0.0
        self._max_bytes = max_bytes
        # What an earlier supervisor of this job (adopted, restarted) wrote counts too.
        self._written = sum(os.fstat(f.fileno()).st_size for f in self._files.values())
        self._truncated = False
        self._unread: set[int] = set()

    def line(self, rank: int, stream: str, text: str) -> None:
        data = format_log_line(time.time(), stream, text)
        if self._max_bytes and stream != "s":
            if self._truncated:
                return
            if self._written + len(data) > self._max_bytes:
                self._truncated = True
                note = (
                    f"[mlcluster] log truncated after {self._max_bytes / (1 << 20):g} MiB: "
                    "further output of this job is not kept (MLClusterConfig.max_log_mib); "
                    "the job goes on"
                )
                for r in self._files:
                    self._write(r, format_log_line(time.time(), "s", note))
                return
        self._write(rank, data)

    def _write(self, rank: int, data: bytes) -> None:
        try:
            self._files[rank].write(data)
        except OSError as exc:
            if exc.filename is None:  # say which file could not be written (a full disk)
                raise OSError(exc.errno, exc.strerror, self._files[rank].name) from exc
            raise
        self._written += len(data)
        self._dirty = True

    def system(self, text: str, rank: int | None = None) -> None:
        for r in [rank] if rank is not None else list(self._files):
            self.line(r, "s", text)

    def unread_record(self, rank: int, over: str = "64 KiB") -> None:
        """A line on `rank`'s report channel that is no record we can read: said once.
        `over`: the longest line that channel reads."""
        if rank not in self._unread:
            self._unread.add(rank)
            self.system(
                f"[mlcluster] rank {rank} sent a report the supervisor could not read (a line"
                f" over {over}, or not signed for it): it was dropped, and later ones of this"
                " rank are not said",
                rank=rank,
            )

    def maybe_notify(self, force: bool = False) -> None:
        now = time.monotonic()
        if self._dirty and (force or now - self._last_notify >= LOG_EVENT_INTERVAL):
            self._store.notify(self._job_id, Change.LOGS)
            self._dirty = False
            self._last_notify = now

    def close(self) -> None:
        try:
            self.maybe_notify(force=True)
        finally:
            for f in self._files.values():
                with contextlib.suppress(OSError):
                    f.close()
