"""Events about Notebooks: pod, StatefulSet and volume events re-issued on their Notebook
(spawn progress the sidebar shows), and the controller's own (e.g. Culled). Pure: no API
calls here."""

from __future__ import annotations

import datetime
import hashlib
import re
from collections.abc import Mapping
from typing import Any

from .crd import API_VERSION, KIND
from .objects import MANAGED_BY, object_labels, rfc3339


def notebook_of_event(event: Mapping[str, Any]) -> str | None:
    """The notebook an event about a notebook's pod, StatefulSet or volume would belong to."""
    involved = event.get("involvedObject") or {}
    name, kind = involved.get("name") or "", involved.get("kind")
    if kind == "Pod" and re.match(r"^.+-0$", name):
        return name[:-2]
    if kind == "StatefulSet":
        return name
    if kind == "PersistentVolumeClaim" and name.endswith("-workspace"):
        return name[: -len("-workspace")]
    return None


def _notebook_event(
    notebook: Mapping[str, Any],
    naming: dict[str, str],
    reason: str,
    message: str,
    type: str,
    count: int,
    first: str,
    last: str,
) -> dict[str, Any]:
    meta = notebook["metadata"]
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {
            **naming,
            "namespace": meta["namespace"],
            "labels": object_labels(meta["name"]),
        },
        "involvedObject": {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "name": meta["name"],
            "namespace": meta["namespace"],
            "uid": meta["uid"],
        },
        "reason": reason,
        "message": message,
        "type": type,
        "count": count,
        "firstTimestamp": first,
        "lastTimestamp": last,
        "source": {"component": MANAGED_BY},
        "reportingComponent": MANAGED_BY,
        "reportingInstance": MANAGED_BY,
    }


def mirrored_event(
    notebook: Mapping[str, Any], event: Mapping[str, Any], now: datetime.datetime
) -> dict[str, Any]:
    """The event re-issued on the Notebook; its name derives from the source event's uid, so
    re-issuing after a restart updates the same event instead of adding a duplicate."""
    involved = event["involvedObject"]
    digest = hashlib.sha1(event["metadata"]["uid"].encode()).hexdigest()[:16]
    stamp = rfc3339(now)
    return _notebook_event(
        notebook,
        {"name": f"{notebook['metadata']['name']}.{digest}"},
        reason=event.get("reason") or "Unknown",
        message=f"{involved.get('kind')} {involved.get('name')}: {event.get('message', '')}",
        type=event.get("type") or "Normal",
        count=int(event.get("count") or 1),
        first=event.get("firstTimestamp") or stamp,
        last=event.get("lastTimestamp") or stamp,
    )


def notebook_event(
    notebook: Mapping[str, Any],
    reason: str,
    message: str,
    now: datetime.datetime,
    type: str = "Normal",
) -> dict[str, Any]:
    """An event the controller itself reports on a Notebook (e.g. Culled)."""
    stamp = rfc3339(now)
    return _notebook_event(
        notebook,
        {"generateName": f"{notebook['metadata']['name']}."},
        reason,
        message,
        type,
        count=1,
        first=stamp,
        last=stamp,
    )
