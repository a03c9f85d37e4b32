"""JobSnapshot: every stored job as a record, kept current from the change feed (what the
server's /metrics reads every few seconds). It must list exactly what `list_jobs()` lists after
any change, made by this store or by another process's, and a look at an unchanged store
must read no job (issue 34: a full read of 10,000 jobs every 5 s made GET /jobs wait)."""

from __future__ import annotations

import json
import time

import pytest

from jupyterlab_mlcluster.jobs.model import JobSpec, JobState, RankState
from jupyterlab_mlcluster.jobs.record import JobRecord
from jupyterlab_mlcluster.jobs.storage.snapshot import JobSnapshot
from jupyterlab_mlcluster.jobs.storage.store import Change, JobStore


def add(store: JobStore, i: int, created: float) -> str:
    job_id = f"jsnap{i:06d}"
    store.insert_job(
        JobRecord(
            id=job_id,
            name=f"n{i}",
            spec=JobSpec(workers=2),
            created=created,
            owner="u",
            origin={"kind": "python"},
        )
    )
    return job_id


@pytest.fixture
def store(tmp_path):
    store = JobStore(tmp_path / "store")
    start = time.time() - 100
    for i in range(20):
        job_id = add(store, i, start + i // 2)  # pairs share a `created`: the id orders them
        if i % 4:
            store.transition(job_id, JobState.SUCCEEDED, started=start, finished=start + 1)
    yield store
    store.close()


def listed(records: list[JobRecord]) -> list[str]:
    """Each record as JSON, without its queue position (a snapshot's records carry none)."""
    return [json.dumps({**r.to_json(), "queue_position": None}, sort_keys=True) for r in records]


def same_as_store(snapshot: JobSnapshot, store: JobStore) -> None:
    expected, total = store.list_jobs()
    got = snapshot.records()
    assert len(got) == total
    assert listed(got) == listed(expected)
    assert all(r.queue_position is None for r in got)


def job_reads(store: JobStore, call) -> list[str]:
    """The statements `call` ran on this thread's connection that read the jobs or ranks."""
    ran: list[str] = []
    db = store.database.connection
    db.set_trace_callback(ran.append)
    try:
        call()
    finally:
        db.set_trace_callback(None)
    return [sql for sql in ran if " FROM jobs" in sql or " FROM ranks" in sql]


def test_follows_every_kind_of_change(store, tmp_path):
    snapshot = JobSnapshot(store)
    same_as_store(snapshot, store)
    queued = "jsnap000000"
    ended = "jsnap000001"
    store.update_ranks(ended, {1: {"state": RankState.FAILED, "exit_code": 3}})
    same_as_store(snapshot, store)  # a rank's change alone
    store.record_metrics(queued, {0: {"cpu_percent": 12.5}})
    store.transition(queued, JobState.RUNNING, started=time.time())
    same_as_store(snapshot, store)
    new = add(store, 99, time.time())
    store.delete_job("jsnap000005")
    same_as_store(snapshot, store)
    assert snapshot.records()[0].id == new
    assert "jsnap000005" not in {r.id for r in snapshot.records()}
    # Another process's writes (its own connection) are in the same feed.
    other = JobStore(tmp_path / "store")
    try:
        other.transition(new, JobState.FAILED, error="boom")
        other.delete_job("jsnap000006")
    finally:
        other.close()
    same_as_store(snapshot, store)


def test_an_unchanged_store_reads_no_job(store):
    snapshot = JobSnapshot(store)
    assert job_reads(store, snapshot.records)  # the first look reads them all
    assert job_reads(store, snapshot.records) == []
    store.notify("jsnap000003", Change.LOGS)  # new log lines: nothing in the rows changed
    assert job_reads(store, snapshot.records) == []
    store.update_job("jsnap000003", reason="why")
    reads = job_reads(store, snapshot.records)
    assert reads and all("json_each" in sql for sql in reads if " FROM jobs" in sql), reads
    assert {r.id: r.reason for r in snapshot.records()}["jsnap000003"] == "why"


def test_a_feed_that_no_longer_reaches_back_reads_everything_again(store):
    snapshot = JobSnapshot(store)
    snapshot.records()
    store.update_job("jsnap000002", reason="lost in the trimmed feed")
    add(store, 50, time.time())
    with store._tx() as db:  # what _event's trimming does once the feed is long
        db.execute("DELETE FROM events WHERE seq <= ?", (store.last_seq() - 1,))
    reads = job_reads(store, snapshot.records)
    assert any(" FROM jobs" in sql and "json_each" not in sql for sql in reads), reads
    same_as_store(snapshot, store)
    assert {r.id: r.reason for r in snapshot.records()}["jsnap000002"] == "lost in the trimmed feed"
