"""Reading: get, list and watch, with selectors, paging, bookmarks and 410 Gone."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import aiohttp.web

from .catalogue import Catalogue, ResourceType
from .protocol import ApiError, bad_request, json_reply, not_found
from .selectors import (
    SelectorError,
    matches_fields,
    matches_labels,
    parse_field_selector,
    parse_label_selector,
)
from .store import Event, Expired, Store, Watcher


class Reads:
    """List/get/watch of RealisticKubernetes (a mixin: the state lives on the emulator)."""

    _store: Store
    _catalogue: Catalogue
    _closing: bool
    bookmark_interval: float
    default_watch_timeout: float

    def _present(self, rtype: ResourceType, obj: Mapping[str, Any]) -> dict[str, Any]:
        # One storage, many served versions: conversion strategy None, like most CRDs.
        return {**obj, "apiVersion": rtype.api_version, "kind": rtype.kind}

    def _require(self, rtype: ResourceType, ns: str | None, name: str) -> dict[str, Any]:
        obj = self._store.get(rtype.group_resource, (ns or "", name))
        if obj is None:
            raise not_found(rtype, name)
        return obj

    def _get(self, rtype: ResourceType, ns: str | None, name: str) -> aiohttp.web.Response:
        return json_reply(200, self._present(rtype, self._require(rtype, ns, name)))

    def _selectors(
        self, rtype: ResourceType, params: Mapping[str, str]
    ) -> Callable[[Mapping[str, Any]], bool]:
        try:
            labels = parse_label_selector(params.get("labelSelector"))
            fields = parse_field_selector(params.get("fieldSelector"), rtype.field_selectors)
        except SelectorError as exc:
            raise bad_request(str(exc)) from None
        return lambda obj: matches_labels(labels, obj) and matches_fields(fields, obj)

    def _list(
        self, rtype: ResourceType, ns: str | None, params: Mapping[str, str]
    ) -> aiohttp.web.Response:
        selected = self._selectors(rtype, params)
        items = [obj for obj in self._store.items(rtype.group_resource, ns) if selected(obj)]
        meta: dict[str, Any] = {"resourceVersion": str(self._store.rv)}
        if params.get("continue"):
            try:
                after = json.loads(base64.urlsafe_b64decode(params["continue"]))
            except ValueError:
                raise ApiError(
                    410, "Expired", "the provided continue parameter is invalid"
                ) from None
            items = [
                o
                for o in items
                if [o["metadata"].get("namespace", ""), o["metadata"]["name"]] > after
            ]
        limit = int(params.get("limit") or 0)
        if limit and len(items) > limit:
            last = items[limit - 1]["metadata"]
            token = json.dumps([last.get("namespace", ""), last["name"]]).encode()
            meta["continue"] = base64.urlsafe_b64encode(token).decode()
            meta["remainingItemCount"] = len(items) - limit
            items = items[:limit]
        return json_reply(
            200,
            {
                "kind": f"{rtype.kind}List",
                "apiVersion": rtype.api_version,
                "metadata": meta,
                "items": [self._present(rtype, o) for o in items],
            },
        )

    async def _watch(
        self,
        raw: aiohttp.web.BaseRequest,
        rtype: ResourceType,
        ns: str | None,
        params: Mapping[str, str],
    ) -> aiohttp.web.StreamResponse:
        selected = self._selectors(rtype, params)

        def in_scope(obj: Mapping[str, Any]) -> bool:
            return (ns is None or obj["metadata"].get("namespace") == ns) and selected(obj)

        timeout = float(params.get("timeoutSeconds") or self.default_watch_timeout)
        bookmarks = params.get("allowWatchBookmarks") in ("true", "1")
        since = params.get("resourceVersion") or "0"
        initial_events = params.get("sendInitialEvents") in ("true", "1")

        watcher = Watcher(rtype.group_resource)
        self._store.watchers.add(watcher)
        response = aiohttp.web.StreamResponse(status=200)
        response.content_type = "application/json"
        try:
            await response.prepare(raw)

            async def send(event: Any) -> None:
                line = event if isinstance(event, bytes) else json.dumps(event).encode() + b"\n"
                await response.write(line)

            start_rv = self._store.rv
            if since == "0" or initial_events:
                backlog: list[tuple[str, dict[str, Any]]] = [
                    ("ADDED", obj)
                    for obj in self._store.items(rtype.group_resource, ns)
                    if in_scope(obj)
                ]
            else:
                try:
                    backlog = [
                        t
                        for e in self._store.events_since(int(since))
                        # the history holds every kind's events: replay only this watch's
                        if e.group_resource == rtype.group_resource
                        and (t := self._translate(e, in_scope)) is not None
                    ]
                except (Expired, ValueError) as exc:
                    message = (
                        str(exc)
                        if isinstance(exc, Expired)
                        else f"invalid resourceVersion {since!r}"
                    )
                    await send(
                        {"type": "ERROR", "object": ApiError(410, "Expired", message).status()}
                    )
                    return response
            for event_type, obj in backlog:
                await send({"type": event_type, "object": self._present(rtype, obj)})
            if initial_events and bookmarks:
                await send(self._bookmark(rtype, {"k8s.io/initial-events-end": "true"}))
            await self._stream_events(
                raw, rtype, watcher, in_scope, start_rv, timeout, bookmarks, send
            )
            await response.write_eof()
        except (ConnectionError, RuntimeError):
            pass  # the client went away
        finally:
            self._store.watchers.discard(watcher)
        return response

    async def _stream_events(
        self,
        raw: aiohttp.web.BaseRequest,
        rtype: ResourceType,
        watcher: Watcher,
        in_scope: Callable[[Mapping[str, Any]], bool],
        start_rv: int,
        timeout: float,
        bookmarks: bool,
        send: Callable[[Any], Awaitable[None]],
    ) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        last_sent = loop.time()
        while not self._closing and loop.time() < deadline:
            if raw.transport is None or raw.transport.is_closing():
                return
            if self._catalogue.get(rtype.group, rtype.version, rtype.plural) is None:
                return  # the CRD was deleted: real servers end such watches
            if watcher.queue.empty():
                try:
                    wait = min(1.0, max(0.0, deadline - loop.time()))
                    first = await asyncio.wait_for(watcher.queue.get(), timeout=wait)
                except TimeoutError:
                    if bookmarks and loop.time() - last_sent >= self.bookmark_interval:
                        await send(self._bookmark(rtype))
                        last_sent = loop.time()
                    continue
            else:
                first = watcher.queue.get_nowait()
            # What a burst of writes queued meanwhile goes out in one write, in order.
            events: list[Event | None] = [first]
            while events[-1] is not None and not watcher.queue.empty():
                events.append(watcher.queue.get_nowait())
            lines = [
                self._event_line(rtype, translated[0], event)
                for event in events
                if event is not None
                and event.rv > start_rv
                and (translated := self._translate(event, in_scope)) is not None
            ]
            if lines:
                await send(b"".join(lines))
                last_sent = loop.time()
            if events[-1] is None:
                return

    def _event_line(self, rtype: ResourceType, event_type: str, event: Event) -> bytes:
        """A watch event's line; the object's JSON is made once per event and version (the
        write's reply made it already)."""
        text = event.text(rtype.api_version, lambda: json.dumps(self._present(rtype, event.obj)))
        return f'{{"type": "{event_type}", "object": {text}}}\n'.encode()

    def _bookmark(
        self, rtype: ResourceType, annotations: dict[str, str] | None = None
    ) -> dict[str, Any]:
        meta: dict[str, Any] = {"resourceVersion": str(self._store.rv)}
        if annotations:
            meta["annotations"] = annotations
        return {
            "type": "BOOKMARK",
            "object": {"kind": rtype.kind, "apiVersion": rtype.api_version, "metadata": meta},
        }

    @staticmethod
    def _translate(
        event: Event, in_scope: Callable[[Mapping[str, Any]], bool]
    ) -> tuple[str, dict[str, Any]] | None:
        # An object entering or leaving the selection is ADDED or DELETED for this watch.
        old_in = event.old is not None and in_scope(event.old)
        if event.type == "DELETED":
            return ("DELETED", event.obj) if old_in else None
        new_in = in_scope(event.obj)
        if new_in:
            return ("MODIFIED" if old_in else "ADDED", event.obj)
        return ("DELETED", event.obj) if old_in else None
