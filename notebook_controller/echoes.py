"""The controller's own writes of owned objects, until their watch events come back.

The reply to a create or a patch carries the resourceVersion its watch event (the echo) will
carry. That event shows what the controller itself just wrote: nothing to repair, and no
status to read from it (a child's status changes come as events of their own). Four of a
served Notebook's six watch events are such echoes, and reconciling each was the larger part
of their cost in a burst. Any later event of the object supersedes the expectation; what is
left of a deleted Notebook's is forgotten at the resync.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from .metrics import OWNED_EVENTS

NotebookKey = tuple[str, str]  # namespace, name
_ObjectKey = tuple[str, str, str]  # kind, namespace, name


def _key(obj: Mapping[str, Any]) -> _ObjectKey:
    meta = obj["metadata"]
    return (str(obj.get("kind")), str(meta.get("namespace")), str(meta.get("name")))


class OwnWrites:
    """The resourceVersion of the controller's last write of each owned object, with the
    Notebook that owns it, until the object's next watch event."""

    def __init__(self) -> None:
        self._expected: dict[_ObjectKey, tuple[str, NotebookKey]] = {}

    def __len__(self) -> int:
        return len(self._expected)

    def wrote(self, written: Mapping[str, Any] | None) -> None:
        """`written`: the API's reply to a write of an object a Notebook owns."""
        meta = (written or {}).get("metadata") or {}
        owners = [ref.get("name") for ref in meta.get("ownerReferences") or () if ref.get("name")]
        if written and meta.get("resourceVersion") and owners:
            notebook = (str(meta.get("namespace")), str(owners[0]))
            self._expected[_key(written)] = (str(meta["resourceVersion"]), notebook)

    def is_echo(self, type: str | None, body: Mapping[str, Any]) -> bool:
        """Whether this watch event of an owned object is its last write's own (counted as
        such; either way, the end of expecting one)."""
        expected = self._expected.pop(_key(body), None)
        echo = (
            type != "DELETED"
            and expected is not None
            and expected[0] == body["metadata"].get("resourceVersion")
        )
        if echo:
            OWNED_EVENTS.labels(outcome="own_write").inc()
        return echo

    def forget_except(self, notebooks: Collection[NotebookKey]) -> None:
        for key in [key for key, (_, owner) in self._expected.items() if owner not in notebooks]:
            del self._expected[key]
