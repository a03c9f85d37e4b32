"""One SQLite file shared by every process of a job store: a connection per thread and
process, and write transactions that cannot interleave.

The job store and the experiment store (sweeps, schedules) keep their tables in the same
file because some decisions must read both in one transaction (may this trial start, may
this tick fire); each opens it through this class.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path


class Database:
    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)
        self._local = threading.local()

    @property
    def connection(self) -> sqlite3.Connection:
        """This thread's connection. One per thread: the server uses executor threads, and
        sqlite3 objects must not be shared between threads mid-transaction; one per process:
        a forked child must not reuse its parent's."""
        db = getattr(self._local, "db", None)
        if db is None or getattr(self._local, "pid", None) != os.getpid():
            db = sqlite3.connect(
                self.path, timeout=30.0, isolation_level=None, check_same_thread=False
            )
            db.row_factory = sqlite3.Row
            db.execute("PRAGMA busy_timeout = 30000")
            self._local.db = db
            self._local.pid = os.getpid()
        return db

    @contextlib.contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """A write transaction; BEGIN IMMEDIATE so read-modify-write cannot interleave."""
        db = self.connection
        db.execute("BEGIN IMMEDIATE")
        try:
            yield db
        except BaseException:
            db.execute("ROLLBACK")
            raise
        else:
            db.execute("COMMIT")

    def close(self) -> None:
        db = getattr(self._local, "db", None)
        if db is not None:
            db.close()
            self._local.db = None
