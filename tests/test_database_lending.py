"""A fleet's store connections (jobs/storage/database.py, `lent_connections_kept`): a
thread about to wait lends its connection, so a process of a thousand mostly waiting job
threads holds about as many connections as it has busy threads, not one per thread; what a
borrower reads is as fresh as from a connection of its own; a forked child never uses its
parent's; a connection mid-transaction is never lent."""

from __future__ import annotations

import contextlib
import gc
import os
import sqlite3
import threading
import time

import pytest

from jupyterlab_mlcluster.jobs.storage.database import Database
from jupyterlab_mlcluster.jobs.storage.store import JobStore

THREADS = 40


def open_connections(store: JobStore) -> int:
    """Connections of this process to the store's file, open now (a closed one's descriptor
    may outlive it: SQLite keeps it while another connection holds a lock on the file)."""
    gc.collect()
    count = 0
    for thing in gc.get_objects():
        if isinstance(thing, sqlite3.Connection):
            with contextlib.suppress(sqlite3.ProgrammingError):  # (closed)
                row = thing.execute("PRAGMA database_list").fetchone()
                count += row is not None and row[2] == str(store.db_path)
    return count


@pytest.fixture
def store(tmp_path):
    store = JobStore(tmp_path / "store")
    yield store
    store.close()


def waiting_threads(store: JobStore, lend: bool) -> int:
    """THREADS threads each read the store, then (lending, or not) wait together: how many
    connections to the store are open while they all wait."""
    everyone_waits = threading.Barrier(THREADS + 1, timeout=60)
    go_on = threading.Event()

    def job() -> None:
        store.database.connection.execute("SELECT COUNT(*) FROM jobs").fetchone()
        if lend:
            Database.lend_this_threads()
        everyone_waits.wait()
        go_on.wait()

    threads = [threading.Thread(target=job) for _ in range(THREADS)]
    for thread in threads:
        thread.start()
    everyone_waits.wait()
    try:
        return open_connections(store)
    finally:
        go_on.set()
        for thread in threads:
            thread.join()


def test_waiting_threads_hold_no_connection_of_their_own(store, monkeypatch):
    kept = 3
    assert waiting_threads(store, lend=True) >= THREADS  # (not lending: one each, kept)
    monkeypatch.setattr(Database, "lent_connections_kept", kept)
    waiting = waiting_threads(store, lend=True)
    assert waiting <= kept + 1, waiting  # the spares, and this thread's own (it never lent)
    print(f"\n{THREADS} waiting threads: {waiting} connections open, not {THREADS + 1}")


def test_a_borrowed_connection_sees_what_others_wrote(store, monkeypatch):
    monkeypatch.setattr(Database, "lent_connections_kept", 2)
    seen: list[object] = []
    store.database.connection.execute("SELECT 1").fetchone()  # this thread's, then lent
    spare = store.database.connection
    Database.lend_this_threads()
    assert store.database._spare == [spare]

    def writer() -> None:  # another thread, another connection: writes, then lends its own
        with store.database.transaction() as db:
            db.execute("CREATE TABLE IF NOT EXISTS probe (x)")
            db.execute("INSERT INTO probe VALUES (42)")
        Database.lend_this_threads()

    thread = threading.Thread(target=writer)
    thread.start()
    thread.join()
    seen.append(store.database.connection.execute("SELECT x FROM probe").fetchone()[0])
    assert seen == [42]


def test_a_connection_mid_transaction_is_not_lent(store, monkeypatch):
    monkeypatch.setattr(Database, "lent_connections_kept", 2)
    with store.database.transaction() as db:
        db.execute("CREATE TABLE IF NOT EXISTS probe (x)")
        Database.lend_this_threads()  # (a wait inside a transaction: the thread keeps it)
        db.execute("INSERT INTO probe VALUES (1)")
        assert store.database.connection is db
    assert store.database.connection.execute("SELECT COUNT(*) FROM probe").fetchone()[0] == 1


def test_a_forked_child_never_borrows_its_parents(store, monkeypatch):
    monkeypatch.setattr(Database, "lent_connections_kept", 2)
    store.database.connection.execute("SELECT 1").fetchone()
    Database.lend_this_threads()
    (parents,) = store.database._spare
    reader, writer = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: says whether it got its own, then leaves without pytest's exit
        code = 1
        try:
            os.close(reader)
            mine = store.database.connection
            ok = mine is not parents and mine.execute("SELECT 1").fetchone()[0] == 1
            os.write(writer, b"own" if ok else b"parents")
            code = 0
        finally:
            os._exit(code)
    os.close(writer)
    with os.fdopen(reader, "rb") as pipe:
        said = pipe.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0 and said == b"own", said
    assert store.database._spare == [parents]  # the parent's spare, untouched


def test_a_fleets_threads_take_turns_at_writing_past_the_busy_timeout(store, monkeypatch):
    """A process whose threads take turns (a fleet: `writers_take_turns`) queues its writers
    in the process, not in SQLite's unfair busy handler: one waiting longer than the busy
    timeout behind another thread's transaction still gets its turn (a thousand claims at
    once: "database is locked")."""
    monkeypatch.setattr(Database, "busy_timeout_s", 0.3)
    monkeypatch.setattr(Database, "writers_take_turns", True)
    store.close()  # (reopened with the short timeout)
    holding = threading.Event()
    outcome: list[object] = []

    def holder() -> None:
        with store.database.transaction() as db:
            db.execute("CREATE TABLE IF NOT EXISTS probe (x)")
            holding.set()
            time.sleep(1.0)  # the write lock held past the busy timeout, on purpose
            db.execute("INSERT INTO probe VALUES (1)")

    def waiter() -> None:
        holding.wait(30)
        try:
            with store.database.transaction() as db:
                db.execute("INSERT INTO probe VALUES (2)")
            outcome.append("written")
        except sqlite3.OperationalError as exc:
            outcome.append(str(exc))

    threads = [threading.Thread(target=holder), threading.Thread(target=waiter)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert outcome == ["written"]
    rows = store.database.connection.execute("SELECT x FROM probe ORDER BY rowid").fetchall()
    assert [row[0] for row in rows] == [1, 2]
