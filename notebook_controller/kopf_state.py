"""kopf's per-object state (handler progress, the last handled configuration) in this
process's memory instead of annotations on each Notebook.

In annotations, every Notebook handled would cost one more PATCH of it, and one more watch
event back, just to record that its handler ran: a sixth of the API calls of a burst of creates.
The handlers are level-based and idempotent (handlers.py), so the state is worth nothing
across a restart: a controller that starts (or becomes the leader) without it sees every
Notebook as new and reconciles it once, as kopf's resume does. Only the retry "touch" stays
an annotation: a change of the object is what wakes kopf up for a retry.

Memory per Notebook: one JSON text (its spec, labels and annotations: what kopf diffs), and
a handler's progress only while it is being retried. `forget_except` drops deleted ones.

kopf also keeps a memory of every object it has seen an event of (a memo, an error
throttler, indexing and daemon state: some 800 bytes), until the object is deleted: at
10,000 Notebooks, 50,000 of them, most for owned objects and pods, and one per Event of the
cluster when events are mirrored. Only a Notebook's is ever read again (whether it was
handled since the listing: resume), so `NotebookMemories` keeps those alone.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from typing import Any

import kopf
from kopf._core.reactor.inventory import ResourceMemories, ResourceMemory  # (kopf.operator's)

from .crd import KIND


def _uid(body: Any) -> str:
    return str(body.get("metadata", {}).get("uid") or "")


class MemoryDiffBaseStorage(kopf.DiffBaseStorage):
    """The essence kopf last handled, by object uid."""

    def __init__(self) -> None:
        super().__init__()
        self._essences: dict[str, str] = {}

    def build(self, *, body: Any, extra_fields: Any = None) -> Any:
        """A Notebook's essence, as kopf builds it; none for any other kind. kopf builds one
        for every event of every kind it watches (a deep copy of the whole body, status
        included) and uses it only for change handlers: the Notebook's. Its owned objects
        and pods only have indexes and event handlers, whose causes never read it. The status
        kopf would copy and then drop is left out of the copy."""
        if body.get("kind") != KIND:
            return None
        if not extra_fields:  # (no handler of ours watches a field of the status)
            without_status: Any = {key: value for key, value in body.items() if key != "status"}
            body = kopf.Body(without_status)
        return super().build(body=body, extra_fields=extra_fields)

    def fetch(self, *, body: Any) -> Any:
        encoded = self._essences.get(_uid(body))
        return json.loads(encoded) if encoded is not None else None

    def store(self, *, body: Any, patch: Any, essence: Any) -> None:
        self._essences[_uid(body)] = json.dumps(essence, separators=(",", ":"))

    def forget_except(self, uids: Collection[str]) -> None:
        for uid in [uid for uid in self._essences if uid not in uids]:
            del self._essences[uid]


class MemoryProgressStorage(kopf.AnnotationsProgressStorage):
    """Handler progress (retries, start times) by object uid and handler; the touch that
    wakes a retry up stays an annotation under `prefix`."""

    def __init__(self, *, prefix: str) -> None:
        super().__init__(prefix=prefix)
        self._records: dict[str, dict[str, Any]] = {}

    def fetch(self, *, key: Any, body: Any) -> Any:
        return self._records.get(_uid(body), {}).get(str(key))

    def store(self, *, key: Any, record: Any, body: Any, patch: Any) -> None:
        kept = {name: value for name, value in dict(record).items() if value is not None}
        self._records.setdefault(_uid(body), {})[str(key)] = kept

    def purge(self, *, key: Any, body: Any, patch: Any) -> None:
        uid = _uid(body)
        records = self._records.get(uid)
        if records is not None:
            records.pop(str(key), None)
            if not records:
                del self._records[uid]

    def forget_except(self, uids: Collection[str]) -> None:
        for uid in [uid for uid in self._records if uid not in uids]:
            del self._records[uid]


class NotebookMemories(ResourceMemories):
    """kopf's per-object memories, kept for Notebooks only: any other object's is made
    afresh for each of its events (kopf's `ephemeral`), which none of our handlers of those
    kinds can tell (no resume, daemon or memo of theirs; the indexers never fail)."""

    async def recall(self, raw_body: Any, **kwargs: Any) -> ResourceMemory:
        if raw_body.get("kind") != KIND:
            kwargs["ephemeral"] = True
        return await super().recall(raw_body, **kwargs)
