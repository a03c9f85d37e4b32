"""What the controller's in-memory indexes keep of each object: only what it reads.

At 10,000 Notebooks the indexes hold some 50,000 objects; kept whole (parsed JSON: a dict
per mapping, a str per key and value) they would be most of the controller's memory. Each value
keeps the metadata the handlers read (names, uid, labels, annotations, ownerReferences,
deletion), the status, and of an owned object's spec only the fields repair_patch compares,
packed as one JSON text each (compressed when long) and parsed again only when a reconcile
compares them (objects._REPAIRABLE). A pod keeps no spec at all (status.py reads its status
only). The strings a Notebook's objects repeat (names, labels, the owner) are kept once.

Pure: from a watch event's body to the value kept.
"""

from __future__ import annotations

import json
import sys
import zlib
from collections.abc import Iterator, Mapping
from typing import Any

from .objects import _REPAIRABLE

# A field's JSON text longer than this is kept compressed (shorter ones gain little or grow).
COMPRESSED_FROM = 256

# Metadata the handlers read (handlers.py, objects.py, status.py, events.py): the rest
# (managedFields, finalizers, ...) is never looked at.
_METADATA = (
    "name",
    "namespace",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "labels",
    "annotations",
    "ownerReferences",
)
# An owned object's: what _one, _ensure, _owned_by and repair_patch read, and its generation
# (which counts changes of its spec: an event with the same one reuses the packed spec).
_OWNED_METADATA = (
    "name",
    "namespace",
    "uid",
    "generation",
    "deletionTimestamp",
    "labels",
    "ownerReferences",
)
_OWNER_REFERENCE = ("apiVersion", "kind", "name", "uid", "controller")


class PackedSpec(Mapping[str, Any]):
    """Some fields of a spec, each kept as its JSON text, compressed when long (a
    StatefulSet's pod template: about 1 KB of text, 55 % of that compressed; at 10,000
    Notebooks, 7 MiB less); reading one parses it afresh (so what a caller gets is its
    own, as a copy would be)."""

    __slots__ = ("_texts",)

    def __init__(self, spec: Mapping[str, Any], fields: tuple[str, ...]) -> None:
        self._texts: dict[str, str | bytes] = {}
        for field in fields:
            if field in spec:
                text = json.dumps(spec[field], separators=(",", ":"))
                self._texts[field] = (
                    zlib.compress(text.encode(), 1) if len(text) > COMPRESSED_FROM else text
                )

    def __getitem__(self, field: str) -> Any:
        text = self._texts[field]
        return json.loads(zlib.decompress(text) if isinstance(text, bytes) else text)

    def __iter__(self) -> Iterator[str]:
        return iter(self._texts)

    def __len__(self) -> int:
        return len(self._texts)

    def __repr__(self) -> str:
        return f"PackedSpec({dict(self)!r})"


# Strings that a Notebook's objects repeat (its name and namespace, the labels, the owner
# reference): kept once (sys.intern), not once per object decoded. A uid or resourceVersion
# of its own is not. On CPython 3.11 (the controller image's) an interned string is freed
# with its last holder; builds that keep interned strings for good (3.12.0-3.12.5, free
# threading) keep a deleted Notebook's few names: some hundred bytes each.
_SHARED_METADATA = ("name", "namespace")
_SHARED_OWNER_REFERENCE = ("apiVersion", "kind", "name", "uid")


def _shared(value: Any) -> Any:
    return sys.intern(value) if type(value) is str else value


def _metadata(meta: Mapping[str, Any], keys: tuple[str, ...] = _METADATA) -> dict[str, Any]:
    kept = {key: meta[key] for key in keys if key in meta}
    for key in _SHARED_METADATA:
        if key in kept:
            kept[key] = _shared(kept[key])
    if isinstance(kept.get("labels"), Mapping):
        kept["labels"] = {_shared(k): _shared(v) for k, v in kept["labels"].items()}
    if "ownerReferences" in kept:
        kept["ownerReferences"] = [
            {
                key: _shared(ref[key]) if key in _SHARED_OWNER_REFERENCE else ref[key]
                for key in _OWNER_REFERENCE
                if key in ref
            }
            for ref in kept["ownerReferences"] or ()
        ]
    return kept


def slim_owned(
    body: Mapping[str, Any], previous: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """An owned object (StatefulSet, Service, PVC, VirtualService, AuthorizationPolicy) as
    the reconcile reads it: metadata, status, and the spec fields it repairs, packed.
    `previous`: what was kept of it before; its packed spec is kept again when the spec's
    generation is the same (packing a StatefulSet's pod template was a seventh of the
    controller's CPU in a burst, once for every event of every object, relists included)."""
    kind = body.get("kind")
    fields = _REPAIRABLE[kind][0] if kind in _REPAIRABLE else ()
    metadata = _metadata(body.get("metadata") or {}, _OWNED_METADATA)
    was = previous["metadata"] if previous is not None else {}
    same = metadata.get("generation") is not None and all(
        was.get(key) == metadata.get(key) for key in ("uid", "generation")
    )
    slim: dict[str, Any] = {
        "apiVersion": _shared(body.get("apiVersion")),
        "kind": _shared(kind),
        "metadata": metadata,
        "spec": previous["spec"] if same and previous is not None else None,
    }
    if slim["spec"] is None:
        slim["spec"] = PackedSpec(body.get("spec") or {}, fields)
    if body.get("status") is not None:
        slim["status"] = body["status"]
    return slim


def slim_pod(body: Mapping[str, Any]) -> dict[str, Any]:
    """A notebook's pod as the status reads it: metadata and status, no spec."""
    slim: dict[str, Any] = {
        "apiVersion": _shared(body.get("apiVersion")),
        "kind": _shared(body.get("kind")),
        "metadata": _metadata(body.get("metadata") or {}),
    }
    if body.get("status") is not None:
        slim["status"] = body["status"]
    return slim


def slim_notebook(body: Mapping[str, Any]) -> dict[str, Any]:
    """A Notebook: spec and status whole (the desired objects are computed from its spec),
    the metadata the handlers read."""
    slim = {key: body[key] for key in ("apiVersion", "kind", "spec", "status") if key in body}
    slim["metadata"] = _metadata(body.get("metadata") or {})
    return slim
