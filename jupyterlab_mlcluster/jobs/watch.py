"""Following the store's change feed: what changed since I last looked?"""

from __future__ import annotations

import dataclasses

from .store import JobStore


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

    def __init__(self, store: JobStore, job_ids: set[str] | None = None, since: int | None = None):
        self.store = store
        self.job_ids = job_ids
        self.seq = store.last_seq() if since is None else since
        self._version: int | None = None

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
            if kind == "logs":
                changes.logs.add(job_id)
            elif kind == "deleted":
                changes.deleted.add(job_id)
                changes.jobs.discard(job_id)
            elif kind != "heartbeat":
                changes.jobs.add(job_id)
        return changes
