"""Every stored job as a record, kept current from the change feed (the `events` table).

For a reader that looks at all jobs every few seconds (the server's /metrics): each look
costs what changed since the last one, not a conversion of every job kept. At 10,000 jobs a
full `list_jobs()` is 1-2.5 s of CPU, holding the GIL the server's requests need; a look at
an unchanged store is one query of the feed. A feed that no longer reaches back to the last
look (the store keeps EVENTS_KEPT rows of it) makes the next look read everything again.
"""

from __future__ import annotations

import threading

from ..record import JobRecord
from .store import Change, JobStore

# Feed rows read per query while catching up.
FEED_BATCH = 5000


class JobSnapshot:
    """All of one store's jobs, newest first, brought up to date on each `records()`."""

    def __init__(self, store: JobStore):
        self.store = store
        self._lock = threading.Lock()  # one look at a time, whichever thread asks
        self._seq: int | None = None  # the feed's last row this snapshot reflects
        self._records: dict[str, JobRecord] = {}
        self._ordered: list[JobRecord] | None = None

    def records(self) -> list[JobRecord]:
        """Every stored job, newest first (as `JobStore.list_jobs()` lists them). The records
        are shared with later calls: read them, never change them. They carry no
        queue_position: a job's changes as others leave the queue without a change of its own
        (ask JobStore.queue_position)."""
        with self._lock:
            changes = self._changes()
            if changes is None:
                self._reload()
            elif changes[0]:
                self._refresh(*changes)
            else:
                self._seq = changes[1]
            if self._ordered is None:
                self._ordered = sorted(self._records.values(), key=_newest_first)
            return list(self._ordered)

    def _changes(self) -> tuple[set[str], int] | None:
        """The ids of the jobs changed since the last look, and the feed's last row; None
        when there was no look yet or the feed no longer reaches back to it."""
        if self._seq is None:
            return None
        changed: set[str] = set()
        seq = self._seq
        while True:
            rows = self.store.events_since(seq, limit=FEED_BATCH)
            if rows and rows[0][0] == -1:  # fell out of the kept window: resynchronise
                return None
            for row_seq, job_id, kind in rows:
                if kind != Change.LOGS:  # new log lines live in files, not in the rows
                    changed.add(job_id)
                seq = row_seq
            if len(rows) < FEED_BATCH:
                return changed, seq
            if len(changed) > len(self._records) // 2:
                return None  # most of them: one full read is cheaper

    def _reload(self) -> None:
        seq = self.store.last_seq()  # before the read: a change in between is read again
        records, _ = self.store.list_jobs()
        self._records = {r.id: _unplaced(r) for r in records}
        self._ordered = None
        self._seq = seq

    def _refresh(self, changed: set[str], seq: int) -> None:
        records, _ = self.store.list_jobs(ids=sorted(changed))
        for job_id in changed:  # those not read again were deleted
            self._records.pop(job_id, None)
        self._records.update((r.id, _unplaced(r)) for r in records)
        self._ordered = None
        self._seq = seq


def _unplaced(record: JobRecord) -> JobRecord:
    record.queue_position = None
    return record


def _newest_first(record: JobRecord) -> tuple[float, str]:
    # list_jobs' order (ORDER BY created DESC, id).
    return (-record.created, record.id)
