"""A grouped listing of jobs (`mlcluster jobs`): the top level, newest first, each session
with its newest cells under it and each sweep with its newest trials (jobs/grouping.py says
what is under what). A sweep is no job: its group is made from its trials."""

from __future__ import annotations

import dataclasses
from typing import Any

from .grouping import TOP_LEVEL, parent_of
from .record import JobRecord


@dataclasses.dataclass
class Group:
    """One entry of the top level: a job (`head`; a session's job heads its cells) or a
    sweep (`head` None: `id` and `name` are the sweep's), with its newest `children`
    (`count` in all)."""

    id: str
    name: str
    head: JobRecord | None
    children: list[JobRecord]
    count: int
    newest: float

    @property
    def kind(self) -> str:
        if self.head is None:
            return "sweep"
        return "session" if self.head.origin.get("session") else "job"


def grouped_jobs(
    store: Any, *, limit: int, shown: int = 5, **filters: Any
) -> tuple[list[Group], int]:
    """The newest `limit` entries of the top level (jobs under no parent, and sweeps whose
    trials are among the newest `limit` jobs), each with at most `shown` children; and how
    many top-level jobs match in all. `filters`: the store's (states, backend, owner)."""
    top, total = store.list_jobs(parent=TOP_LEVEL, limit=limit, **filters)
    groups = {r.id: Group(r.id, r.name, r, [], 0, r.created) for r in top}
    window, _ = store.list_jobs(limit=limit, **filters)
    for record in window:
        sweep = record.origin.get("sweep")
        parent = parent_of(record.origin)
        if not isinstance(sweep, dict) or parent is None or parent in groups:
            continue
        name = str(sweep.get("name") or record.name.rpartition("-t")[0] or parent)
        groups[parent] = Group(parent, name, None, [], 0, record.created)
    for group in groups.values():
        children, count = store.list_jobs(parent=group.id, limit=shown, **filters)
        group.children, group.count = children, count
        if children:
            group.newest = max(group.newest, children[0].created)
    entries = sorted(groups.values(), key=lambda g: g.newest, reverse=True)[:limit]
    return entries, total
