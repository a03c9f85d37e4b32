"""One SQLite file shared by every process of a job store: a connection per thread and
process, and write transactions that cannot interleave.

The job store and the experiment store (sweeps, schedules) keep their tables in the same
file because some decisions must read both in one transaction (may this trial start, may
this tick fire); each opens it through this class.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import threading
import time
import urllib.parse
import weakref
from collections.abc import Iterator
from pathlib import Path

from .fsinfo import is_storage_full

log = logging.getLogger(__name__)

# After falling back to a read-only connection (full disk), try a normal one again this often.
READ_ONLY_RETRY = 1.0


# One lock per database file for this process's write transactions, when its threads take
# turns (Database.writers_take_turns). Re-entrant: the job store and the experiment store
# share the file. Made again in a forked child: a lock another thread held stays held there.
_TURNS: dict[str, threading.RLock] = {}
_TURNS_GUARD = threading.Lock()


def _turn_at_writing(path: Path) -> threading.RLock:
    with _TURNS_GUARD:
        return _TURNS.setdefault(str(path), threading.RLock())


def _forget_turns() -> None:
    global _TURNS_GUARD
    _TURNS_GUARD = threading.Lock()
    _TURNS.clear()


os.register_at_fork(after_in_child=_forget_turns)


# Every Database of this process: a write transaction first ends what an interrupt left
# open on any of them (the job store and the experiment store each hold a connection to
# the same file, and one's leftover lock would lock the other out).
_ALL: weakref.WeakSet[Database] = weakref.WeakSet()


class Database:
    # A process whose many threads mostly wait (a fleet, jobs/running/fleet.py: a thread per
    # job) lends connections: a thread about to wait gives its connections back
    # (`lend_this_threads`), and the next thread that needs one takes it, so the process holds
    # about as many connections as it has busy threads. A connection costs 110-170 KiB
    # (schema, statement cache, pages), measured: 1,000 waiting jobs' own came to ~140 MiB.
    # None: each thread keeps its own. The number: how many idle ones are kept.
    lent_connections_kept: int | None = None
    # A process whose threads may write all at once (a fleet adopting a thousand jobs) makes
    # them queue in the process, in turn, instead of in SQLite's busy handler, which sleeps
    # and retries and is not fair: some of a thousand claims waited past its timeout
    # ("database is locked"). Other processes still meet the busy timeout. Only for a process
    # that takes no KeyboardInterrupt (a fleet handles SIGINT itself): an interrupt landing
    # between the turn and the transaction would leave the turn held against its threads.
    writers_take_turns = False
    busy_timeout_s = 30.0  # how long a statement waits for another process's write lock

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)
        self._local = threading.local()
        self._spare: list[sqlite3.Connection] = []  # lent, idle (made by process _spare_pid)
        self._spare_pid = os.getpid()
        self._spare_lock = threading.Lock()
        _ALL.add(self)

    @property
    def connection(self) -> sqlite3.Connection:
        """This thread's connection. One per thread: the server uses executor threads, and
        sqlite3 objects must not be shared between threads mid-transaction; one per process:
        a forked child must not reuse its parent's."""
        return self._connection(retry_after=READ_ONLY_RETRY)

    def _connection(self, retry_after: float) -> sqlite3.Connection:
        db = getattr(self._local, "db", None)
        fresh = db is None or getattr(self._local, "pid", None) != os.getpid()
        stale = getattr(self._local, "read_only_since", None)
        if fresh or (stale is not None and time.monotonic() - stale >= retry_after):
            if db is not None and not fresh:
                db.close()
            spare = self._borrow()
            db, error = (spare, None) if spare is not None else self._open()
            self._local.db = db
            self._local.pid = os.getpid()
            self._local.read_only_since = None if error is None else time.monotonic()
            self._local.error = error
        assert db is not None  # opened above when there was none
        return db

    @property
    def read_only(self) -> bool:
        """Is this thread's connection the full-disk fallback (reads only)?"""
        self.connection  # noqa: B018 - (re)opens it
        return self._local.read_only_since is not None

    def _open(self) -> tuple[sqlite3.Connection, sqlite3.Error | None]:
        """A normal connection; or, when the disk is too full for one (in WAL mode a reader
        must create and map the -shm index), an immutable read-only one with the error that
        refused the normal one: listings keep working, writes raise that error."""
        db = self._connect(str(self.path), uri=False)
        try:
            db.execute("PRAGMA schema_version").fetchone()  # opens the file (and the WAL index)
            return db, None
        except sqlite3.Error as exc:
            db.close()
            if not self.path.exists() or not is_storage_full(exc, self.path.parent):
                raise
            error = exc
        # immutable: no locks, no -shm, no journal; what the WAL holds beyond the last
        # checkpoint is not seen (the connection that wrote it checkpoints as it closes).
        uri = f"file:{urllib.parse.quote(str(self.path))}?immutable=1"
        return self._connect(uri, uri=True), error

    @classmethod
    def _connect(cls, target: str, *, uri: bool) -> sqlite3.Connection:
        db = sqlite3.connect(
            target,
            timeout=cls.busy_timeout_s,
            isolation_level=None,
            check_same_thread=False,
            uri=uri,
        )
        db.row_factory = sqlite3.Row
        db.execute(f"PRAGMA busy_timeout = {int(cls.busy_timeout_s * 1000)}")
        return db

    # -- lending (see lent_connections_kept) ------------------------------------------------

    def _borrow(self) -> sqlite3.Connection | None:
        if self.lent_connections_kept is None:
            return None
        with self._spare_lock:
            if self._spare_pid != os.getpid():  # a forked child: never its parent's (unclosed)
                self._spare, self._spare_pid = [], os.getpid()
            return self._spare.pop() if self._spare else None

    def lend(self) -> None:
        """This thread is about to wait: its connection goes to the spares (when lending;
        a read-only fallback is closed, the next use tries a normal one)."""
        kept = self.lent_connections_kept
        db = getattr(self._local, "db", None)
        if kept is None or db is None or getattr(self._local, "pid", None) != os.getpid():
            return
        if db.in_transaction:
            return  # (never mid-transaction: its thread goes on with it)
        self._local.db = None
        if self._local.read_only_since is not None:
            self._local.read_only_since = None
            db.close()
            return
        with self._spare_lock:
            if self._spare_pid == os.getpid() and len(self._spare) < kept:
                self._spare.append(db)
                return
        db.close()

    @staticmethod
    def lend_this_threads() -> None:
        """`lend` this thread's connection of every Database of the process."""
        for database in list(_ALL):
            database.lend()

    @contextlib.contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """A write transaction; BEGIN IMMEDIATE so read-modify-write cannot interleave."""
        db = self._connection(retry_after=0.0)  # a writer tries a normal connection again
        if self._local.read_only_since is not None:
            # The full disk that made this connection read-only (is_storage_full knows it).
            raise sqlite3.OperationalError(f"database or disk is full: {self._local.error}")
        for database in list(_ALL):
            if database.path == self.path:
                database.end_interrupted()
        turn = _turn_at_writing(self.path) if self.writers_take_turns else contextlib.nullcontext()
        with turn:
            try:
                db.execute("BEGIN IMMEDIATE")
                yield db
                db.execute("COMMIT")
            except BaseException:
                # A failed COMMIT (SQLITE_FULL, IOERR) may or may not have rolled back already.
                if db.in_transaction:
                    with contextlib.suppress(sqlite3.Error):
                        db.execute("ROLLBACK")
                raise

    def end_interrupted(self) -> None:
        """Roll back a write transaction of this thread that an interrupt (Ctrl-C in a
        kernel or the CLI) left open, landing between its BEGIN and its end (in a `with`
        statement's own machinery, say): it would hold the store's write lock against every
        other process for as long as this one lives. Transactions never nest here, so an
        open one outside `transaction()` is always such a leftover."""
        db = getattr(self._local, "db", None)
        if (
            db is not None
            and db.in_transaction
            and getattr(self._local, "pid", None) == os.getpid()
        ):
            log.warning("rolling back a write transaction an interrupt left open")
            with contextlib.suppress(sqlite3.Error):
                db.execute("ROLLBACK")

    def close(self) -> None:
        """Close this thread's connection, and the spares (see lend)."""
        db = getattr(self._local, "db", None)
        if db is not None:
            db.close()
            self._local.db = None
            self._local.read_only_since = None
        with self._spare_lock:
            spares = self._spare if self._spare_pid == os.getpid() else []
            self._spare = []
        for spare in spares:
            spare.close()
