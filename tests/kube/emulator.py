"""A realistic Kubernetes API server for tests: kmock's KubernetesEmulator, made strict.

``RealisticKubernetes`` subclasses ``kmock.KubernetesEmulator`` and keeps kmock's HTTP server,
request objects, discovery endpoints and reaction DSL (so a test can still inject a fault with
``kube['post /api/v1/namespaces/x/pods'] << 500``). Every resource request that no test
reaction claims is served by the realistic API below instead of kmock's loose defaults:

- 201 on create with uid, resourceVersion, creationTimestamp, generation, generateName;
  409 AlreadyExists / Conflict, 404 NotFound, 422 Invalid, 400 BadRequest as ``Status`` objects;
- one monotonically increasing resourceVersion; stale resourceVersions on update -> 409;
- list/watch with label selectors (equality and set-based) and field selectors; paging;
- watch from a resourceVersion with timeoutSeconds, bookmarks, sendInitialEvents, 410 Gone;
- the status subresource; merge, strategic-merge and JSON patches;
- finalizers, ownerReference garbage collection (background, foreground, orphan), namespace
  termination; CRDs installed through the API appear in discovery and validate their objects;
- pod logs (``follow``, ``container``, ``timestamps``, ``sinceTime``, ``tailLines``).

``EmulatorThread`` serves one on 127.0.0.1 from its own thread and event loop.
"""
from __future__ import annotations

import asyncio
import base64
import copy
import datetime
import json
import random
import re
import threading
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import aiohttp.web
import attrs
import kmock
import yaml

from . import patching, rules, validation
from .catalogue import Catalogue, ResourceType
from .logs import LogQuery, PodLogs, container_state
from .selectors import (Requirement, SelectorError, matches_fields, matches_labels,
                        parse_field_selector, parse_label_selector)
from .store import Event, Expired, GroupResource, Key, Store, Watcher, owner_uids

T = TypeVar('T')
CRDS: GroupResource = ('apiextensions.k8s.io', 'customresourcedefinitions')
NAMESPACES: GroupResource = ('', 'namespaces')
PODS: GroupResource = ('', 'pods')
SERVER_VERSION = {'major': '1', 'minor': '33', 'gitVersion': 'v1.33.0+kmock-realistic',
                  'gitCommit': '60a317eadfcb839692a5b8d8b05a8dc8b2eb0b7b', 'gitTreeState': 'clean',
                  'buildDate': '2025-04-23T13:07:02Z', 'goVersion': 'go1.24.2', 'compiler': 'gc',
                  'platform': 'linux/amd64'}
MAX_REQUEST_BYTES = 3 * 1024 * 1024  # the kube-apiserver's MaxRequestBodyBytes
_NAME_ALPHABET = 'bcdfghjklmnpqrstvwxz2456789'  # what the apiserver uses for generateName


def now_rfc3339() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%dT%H:%M:%SZ')


class ApiError(Exception):
    """An API failure, rendered as a ``Status`` object."""

    def __init__(self, code: int, reason: str, message: str,
                 details: Mapping[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details

    def status(self) -> dict[str, Any]:
        body = {'kind': 'Status', 'apiVersion': 'v1', 'metadata': {}, 'status': 'Failure',
                'message': self.message, 'reason': self.reason, 'code': self.code}
        if self.details:
            body['details'] = dict(self.details)
        return body


def not_found(rtype: ResourceType, name: str) -> ApiError:
    return ApiError(404, 'NotFound', f'{rtype.qualified_name} "{name}" not found',
                    {'name': name, 'group': rtype.group, 'kind': rtype.plural})


def invalid(rtype: ResourceType, name: str, causes: list[validation.Cause]) -> ApiError:
    text = ', '.join(f'{c.field}: {c.message}' for c in causes)
    group_kind = f'{rtype.kind}.{rtype.group}' if rtype.group else rtype.kind
    return ApiError(422, 'Invalid', f'{group_kind} "{name}" is invalid: [{text}]', {
        'name': name, 'group': rtype.group, 'kind': rtype.kind,
        'causes': [{'reason': c.reason, 'message': c.message, 'field': c.field} for c in causes]})


def bad_request(message: str) -> ApiError:
    return ApiError(400, 'BadRequest', message)


@dataclass(frozen=True)
class ApiPath:
    group: str
    version: str
    plural: str
    namespace: str | None = None
    name: str | None = None
    subresource: str | None = None


def parse_api_path(path: str) -> ApiPath | None:
    """``/api/v1/namespaces/ns/pods/x/log`` -> its parts; None for non-resource paths."""
    parts = [part for part in path.split('/') if part]
    if len(parts) >= 3 and parts[0] == 'api':
        group, version, rest = '', parts[1], parts[2:]
    elif len(parts) >= 4 and parts[0] == 'apis':
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        return None
    namespace = None
    if rest[0] == 'namespaces' and len(rest) >= 3:
        namespace, rest = rest[1], rest[2:]
    plural, name, sub = rest[0], (rest[1] if len(rest) > 1 else None), rest[2:]
    return ApiPath(group, version, plural, namespace, name, '/'.join(sub) or None)


class _ServeRealistically(Exception):
    """Raised by the lowest-priority reaction: no test reaction claimed this request."""


def _without_rv(obj: Mapping[str, Any]) -> dict[str, Any]:
    meta = {k: v for k, v in obj.get('metadata', {}).items() if k != 'resourceVersion'}
    return {**obj, 'metadata': meta}


def _spec_part(obj: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in obj.items() if k not in ('metadata', 'status', 'apiVersion', 'kind')}


def _json(status: int, body: Any, warnings: list[str] | None = None) -> aiohttp.web.Response:
    headers = {'Warning': ', '.join(f'299 - {json.dumps(w)}' for w in warnings)} if warnings else None
    return aiohttp.web.Response(status=status, text=json.dumps(body),
                                content_type='application/json', headers=headers)


@attrs.define(kw_only=True)
class RealisticKubernetes(kmock.KubernetesEmulator):
    """kmock's emulator with the semantics of a real kube-apiserver (see module docstring)."""

    event_window: int = 10_000  # watch history kept; older resourceVersions get 410 Gone
    bookmark_interval: float = 60.0  # seconds between BOOKMARK events on quiet watches
    default_watch_timeout: float = 1800.0  # when the client sends no timeoutSeconds
    gc_delay: float = 0.005  # the garbage collector batches work after this pause
    request_history: int = 2_000  # requests kept for kmock-style assertions (bounded memory)

    _store: Store = attrs.field(init=False)
    _catalogue: Catalogue = attrs.field(init=False, factory=Catalogue)
    _logs: PodLogs | None = attrs.field(init=False, default=None)
    _gc_task: asyncio.Task[None] | None = attrs.field(init=False, default=None)
    _gc_wakeup: asyncio.Event | None = attrs.field(init=False, default=None)
    _gc_orphans: set[tuple[GroupResource, Key]] = attrs.field(init=False, factory=set)
    _gc_foreground: set[tuple[GroupResource, Key]] = attrs.field(init=False, factory=set)
    _gc_namespaces: set[str] = attrs.field(init=False, factory=set)
    _closing: bool = attrs.field(init=False, default=False)
    _request_count: int = attrs.field(init=False, default=0)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self._store = Store(window=self.event_window)
        for name in ('default', 'kube-system', 'kube-public', 'kube-node-lease'):
            namespace = {'apiVersion': 'v1', 'kind': 'Namespace', 'metadata': {'name': name}}
            self._new_object_meta(namespace)
            rules.apply_create_defaults(NAMESPACES, namespace)
            self._store.put(NAMESPACES, namespace)
        # Above kmock's own loose fallbacks, below anything a test declares.
        (self.fallback ** 1)[self._is_resource_request] << self._serve_realistically
        # Real API servers answer discovery paths with a trailing slash too (the Python
        # client's VersionApi, CoreApi and CoreV1Api ask for /version/, /api/, /api/v1/).
        self.fallback['get /version/'] << self._serve_server_version
        self.fallback['get /api/'] << self._serve_api
        self.fallback['get /apis/'] << self._serve_apis
        self.fallback['get', re.compile(r'/api/[^/]+/')] << self._serve_version

    # -- kmock plumbing --------------------------------------------------------------------
    async def __aenter__(self) -> 'RealisticKubernetes':
        await super().__aenter__()
        self._logs = PodLogs()
        self._gc_wakeup = asyncio.Event()
        self._gc_task = asyncio.create_task(self._gc_loop())
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close_streams()
        if self._gc_task is not None:
            self._gc_task.cancel()
        await super().__aexit__(*exc)

    async def close_streams(self) -> None:
        """End every open watch and log stream (before the HTTP server stops)."""
        self._closing = True
        for watcher in list(self._store.watchers):
            watcher.queue.put_nowait(None)  # type: ignore[arg-type]  # wakes the stream to end
        if self._logs is not None:
            await self._logs.notify()

    async def __call__(self, raw: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        # kmock 0.8 cannot parse some valid paths (e.g. GET /api/v1/namespaces), so resource
        # requests are parsed here and handed to kmock's dispatch as ordinary kmock Requests.
        # Bodies up to the kube-apiserver's limit (aiohttp's default is 1 MiB).
        raw = raw.clone(client_max_size=MAX_REQUEST_BYTES)
        body = await raw.read()
        try:
            data = json.loads(body) if body else None
        except ValueError:
            data = None
        path = parse_api_path(raw.path)
        resource = kmock.resource(path.group, path.version, path.plural) if path else None
        self._request_count += 1
        request = kmock.Request(
            id=self._request_count, raw_request=raw, url=raw.url, method=raw.method,
            params=dict(raw.query), headers=dict(raw.headers), cookies=dict(raw.cookies),
            body=body, text=body.decode('utf-8', 'replace'), data=data,
            action=self._guess_action(path, raw.method, raw.query.get('watch')),
            resource=resource, namespace=path.namespace if path else None,
            name=path.name if path else None, subresource=path.subresource if path else None,
        )
        self._requests.append(request)
        if len(self._requests) % 100 == 0:
            self._forget_old_requests()
        try:
            return await self._handle(request)
        except ApiError as exc:
            return _json(exc.code, exc.status())
        except Exception as exc:  # a test reaction failed: report it the way kmock does
            if self._errors:
                self._errors[-1].append(exc)
            return await self._render_error(exc)

    def _forget_old_requests(self) -> None:
        # kmock keeps every request (on the root and on each reaction); bound that memory.
        for holder in [self, *self._payloads]:
            requests = holder._requests
            if len(requests) > self.request_history:
                del requests[:len(requests) - self.request_history]

    @staticmethod
    def _guess_action(path: ApiPath | None, method: str, watch: str | None) -> kmock.action | None:
        if path is None:
            return None
        if method == 'GET' and watch in ('true', '1'):
            return kmock.action.WATCH
        table = ({'GET': kmock.action.FETCH, 'PATCH': kmock.action.UPDATE,
                  'PUT': kmock.action.UPDATE, 'DELETE': kmock.action.DELETE} if path.name else
                 {'GET': kmock.action.LIST, 'POST': kmock.action.CREATE})
        return table.get(method)

    async def _handle(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        try:
            # kmock.RawHandler's dispatch, skipping KubernetesEmulator's loose object tracking.
            return await kmock.RawHandler._handle(self, request)
        except _ServeRealistically:
            return await self._serve(request)

    @staticmethod
    def _is_resource_request(request: kmock.Request) -> bool:
        return request.resource is not None and request.resource.plural is not None

    @staticmethod
    def _serve_realistically(request: kmock.Request) -> None:
        raise _ServeRealistically()

    # -- discovery ---------------------------------------------------------------------------
    async def _serve_root(self, request: kmock.Request) -> dict[str, Any]:
        paths = {'/api', '/api/v1', '/apis', '/version'}
        for group, versions in self._catalogue.groups().items():
            if group:
                paths |= {f'/apis/{group}'} | {f'/apis/{group}/{v}' for v in versions}
        return {'paths': sorted(paths)}

    async def _serve_server_version(self, request: kmock.Request) -> dict[str, Any]:
        return dict(SERVER_VERSION)

    async def _serve_api(self, request: kmock.Request) -> dict[str, Any]:
        return {'kind': 'APIVersions', 'versions': ['v1'],
                'serverAddressByClientCIDRs': [{'clientCIDR': '0.0.0.0/0',
                                                'serverAddress': '127.0.0.1'}]}

    def _group_doc(self, group: str, versions: list[str]) -> dict[str, Any]:
        entries = [{'groupVersion': f'{group}/{v}', 'version': v} for v in versions]
        return {'name': group, 'versions': entries, 'preferredVersion': entries[0]}

    async def _serve_apis(self, request: kmock.Request) -> dict[str, Any]:
        groups = [self._group_doc(g, vs) for g, vs in sorted(self._catalogue.groups().items()) if g]
        return {'kind': 'APIGroupList', 'apiVersion': 'v1', 'groups': groups}

    async def _serve_group(self, request: kmock.Request) -> dict[str, Any]:
        group = request.url.path.strip('/').split('/')[1]
        versions = self._catalogue.groups().get(group)
        if not group or not versions:
            raise kmock.KubernetesResourceNotFoundError()
        return {'kind': 'APIGroup', 'apiVersion': 'v1', **self._group_doc(group, versions)}

    async def _serve_version(self, request: kmock.Request) -> dict[str, Any]:
        parts = request.url.path.strip('/').split('/')
        group, version = ('', parts[1]) if parts[0] == 'api' else (parts[1], parts[2])
        types = [r for r in self._catalogue.all() if (r.group, r.version) == (group, version)]
        if not types:
            raise kmock.KubernetesResourceNotFoundError()
        return {'kind': 'APIResourceList', 'apiVersion': 'v1',
                'groupVersion': f'{group}/{version}' if group else version,
                'resources': [e for r in sorted(types, key=lambda r: r.plural)
                              for e in r.discovery_entries()]}

    # -- dispatch ----------------------------------------------------------------------------
    async def _serve(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        raw = request._raw_request
        assert raw is not None
        path = parse_api_path(raw.path)
        assert path is not None
        rtype = self._catalogue.get(path.group, path.version, path.plural)
        if rtype is None or (path.namespace is not None and not rtype.namespaced):
            raise ApiError(404, 'NotFound', 'the server could not find the requested resource')
        method, params, sub = raw.method, request.params, path.subresource
        ns = path.namespace if rtype.namespaced else None
        if path.name is None:
            if method == 'GET' and params.get('watch') in ('true', '1'):
                return await self._watch(raw, rtype, ns, params)
            handlers: dict[str, Callable[[], Any]] = {
                'GET': lambda: self._list(rtype, ns, params),
                'POST': lambda: self._create(rtype, ns, request),
                'DELETE': lambda: self._delete_collection(rtype, ns, request),
            }
        elif sub is None:
            handlers = {
                'GET': lambda: self._get(rtype, ns, path.name),
                'PUT': lambda: self._replace(rtype, ns, path.name, request, None),
                'PATCH': lambda: self._patch(rtype, ns, path.name, request, None),
                'DELETE': lambda: self._delete_request(rtype, ns, path.name, request),
            }
        elif sub == 'status' and rtype.has_status:
            handlers = {
                'GET': lambda: self._get(rtype, ns, path.name),
                'PUT': lambda: self._replace(rtype, ns, path.name, request, 'status'),
                'PATCH': lambda: self._patch(rtype, ns, path.name, request, 'status'),
            }
        elif sub == 'log' and rtype.group_resource == PODS and method == 'GET':
            return await self._pod_log(raw, rtype, ns or '', path.name, params)
        else:
            raise ApiError(404, 'NotFound', 'the server could not find the requested resource')
        if method not in handlers:
            raise ApiError(405, 'MethodNotAllowed', f'the server does not allow this method on the '
                           f'requested resource')
        result = handlers[method]()
        return await result if isinstance(result, Awaitable) else result

    # -- reading -----------------------------------------------------------------------------
    def _present(self, rtype: ResourceType, obj: Mapping[str, Any]) -> dict[str, Any]:
        # One storage, many served versions: conversion strategy None, like most CRDs.
        return {**obj, 'apiVersion': rtype.api_version, 'kind': rtype.kind}

    def _require(self, rtype: ResourceType, ns: str | None, name: str) -> dict[str, Any]:
        obj = self._store.get(rtype.group_resource, (ns or '', name))
        if obj is None:
            raise not_found(rtype, name)
        return obj

    def _get(self, rtype: ResourceType, ns: str | None, name: str) -> aiohttp.web.Response:
        return _json(200, self._present(rtype, self._require(rtype, ns, name)))

    def _selectors(self, rtype: ResourceType, params: Mapping[str, str]) -> Callable[[Mapping[str, Any]], bool]:
        try:
            labels = parse_label_selector(params.get('labelSelector'))
            fields = parse_field_selector(params.get('fieldSelector'), rtype.field_selectors)
        except SelectorError as exc:
            raise bad_request(str(exc)) from None
        return lambda obj: matches_labels(labels, obj) and matches_fields(fields, obj)

    def _list(self, rtype: ResourceType, ns: str | None, params: Mapping[str, str]) -> aiohttp.web.Response:
        selected = self._selectors(rtype, params)
        items = [obj for obj in self._store.items(rtype.group_resource, ns) if selected(obj)]
        meta: dict[str, Any] = {'resourceVersion': str(self._store.rv)}
        if params.get('continue'):
            try:
                after = json.loads(base64.urlsafe_b64decode(params['continue']))
            except ValueError:
                raise ApiError(410, 'Expired', 'the provided continue parameter is invalid') from None
            items = [o for o in items if [o['metadata'].get('namespace', ''), o['metadata']['name']] > after]
        limit = int(params.get('limit') or 0)
        if limit and len(items) > limit:
            last = items[limit - 1]['metadata']
            token = json.dumps([last.get('namespace', ''), last['name']]).encode()
            meta['continue'] = base64.urlsafe_b64encode(token).decode()
            meta['remainingItemCount'] = len(items) - limit
            items = items[:limit]
        return _json(200, {'kind': f'{rtype.kind}List', 'apiVersion': rtype.api_version,
                           'metadata': meta, 'items': [self._present(rtype, o) for o in items]})

    async def _watch(self, raw: aiohttp.web.BaseRequest, rtype: ResourceType, ns: str | None,
                     params: Mapping[str, str]) -> aiohttp.web.StreamResponse:
        selected = self._selectors(rtype, params)
        in_scope = lambda obj: (ns is None or obj['metadata'].get('namespace') == ns) and selected(obj)
        timeout = float(params.get('timeoutSeconds') or self.default_watch_timeout)
        bookmarks = params.get('allowWatchBookmarks') in ('true', '1')
        since = params.get('resourceVersion') or '0'
        initial_events = params.get('sendInitialEvents') in ('true', '1')

        watcher = Watcher(rtype.group_resource)
        self._store.watchers.add(watcher)
        response = aiohttp.web.StreamResponse(status=200)
        response.content_type = 'application/json'
        try:
            await response.prepare(raw)
            send = lambda event: response.write(json.dumps(event).encode() + b'\n')
            start_rv = self._store.rv
            if since == '0' or initial_events:
                backlog: list[tuple[str, dict[str, Any]]] = [
                    ('ADDED', obj) for obj in self._store.items(rtype.group_resource, ns) if in_scope(obj)]
            else:
                try:
                    backlog = [t for e in self._store.events_since(int(since))
                               if (t := self._translate(e, in_scope)) is not None]
                except (Expired, ValueError) as exc:
                    message = str(exc) if isinstance(exc, Expired) else f'invalid resourceVersion {since!r}'
                    await send({'type': 'ERROR', 'object': ApiError(410, 'Expired', message).status()})
                    return response
            for event_type, obj in backlog:
                await send({'type': event_type, 'object': self._present(rtype, obj)})
            if initial_events and bookmarks:
                await send(self._bookmark(rtype, {'k8s.io/initial-events-end': 'true'}))
            await self._stream_events(raw, rtype, watcher, in_scope, start_rv, timeout,
                                      bookmarks, send)
            await response.write_eof()
        except (ConnectionError, RuntimeError):
            pass  # the client went away
        finally:
            self._store.watchers.discard(watcher)
        return response

    async def _stream_events(self, raw: aiohttp.web.BaseRequest, rtype: ResourceType,
                             watcher: Watcher, in_scope: Callable[[Mapping[str, Any]], bool],
                             start_rv: int, timeout: float, bookmarks: bool,
                             send: Callable[[Any], Awaitable[None]]) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        last_sent = loop.time()
        while not self._closing and loop.time() < deadline:
            if raw.transport is None or raw.transport.is_closing():
                return
            if self._catalogue.get(rtype.group, rtype.version, rtype.plural) is None:
                return  # the CRD was deleted: real servers end such watches
            try:
                wait = min(1.0, max(0.0, deadline - loop.time()))
                event: Event | None = await asyncio.wait_for(watcher.queue.get(), timeout=wait)
            except asyncio.TimeoutError:
                if bookmarks and loop.time() - last_sent >= self.bookmark_interval:
                    await send(self._bookmark(rtype))
                    last_sent = loop.time()
                continue
            if event is None:
                return
            if event.rv <= start_rv:
                continue
            translated = self._translate(event, in_scope)
            if translated is not None:
                await send({'type': translated[0], 'object': self._present(rtype, translated[1])})
                last_sent = loop.time()

    def _bookmark(self, rtype: ResourceType, annotations: dict[str, str] | None = None) -> dict[str, Any]:
        meta: dict[str, Any] = {'resourceVersion': str(self._store.rv)}
        if annotations:
            meta['annotations'] = annotations
        return {'type': 'BOOKMARK', 'object': {'kind': rtype.kind, 'apiVersion': rtype.api_version,
                                               'metadata': meta}}

    @staticmethod
    def _translate(event: Event, in_scope: Callable[[Mapping[str, Any]], bool]) -> tuple[str, dict[str, Any]] | None:
        # An object entering or leaving the selection is ADDED or DELETED for this watch.
        old_in = event.old is not None and in_scope(event.old)
        if event.type == 'DELETED':
            return ('DELETED', event.obj) if old_in else None
        new_in = in_scope(event.obj)
        if new_in:
            return ('MODIFIED' if old_in else 'ADDED', event.obj)
        return ('DELETED', event.obj) if old_in else None

    # -- writing -----------------------------------------------------------------------------
    def _body(self, request: kmock.Request) -> dict[str, Any]:
        content_type = request.headers.get('Content-Type', 'application/json').split(';')[0]
        if 'yaml' in content_type:
            try:
                data = yaml.safe_load(request.body)
            except yaml.YAMLError as exc:
                raise bad_request(f'the body of the request was in an unknown format: {exc}') from None
        elif request.body:
            try:
                data = json.loads(request.body)
            except ValueError as exc:
                raise bad_request(f'the body of the request was in an unknown format: {exc}') from None
        else:
            data = None
        if not isinstance(data, dict):
            raise bad_request('the body of the request must be a JSON object')
        return data

    def _check_type(self, rtype: ResourceType, obj: Mapping[str, Any]) -> None:
        if obj.get('kind') != rtype.kind or not obj.get('apiVersion'):
            raise bad_request(f'the kind in the body ({obj.get("kind")!r}) does not match the '
                              f'expected kind {rtype.kind!r} (apiVersion and kind are required)')
        if obj['apiVersion'] != rtype.api_version:
            raise bad_request(f'the API version in the data ({obj["apiVersion"]}) does not match '
                              f'the expected API version ({rtype.api_version})')

    @staticmethod
    def _new_object_meta(obj: dict[str, Any]) -> dict[str, Any]:
        meta = obj['metadata']
        meta.update(uid=str(uuid.uuid4()), creationTimestamp=now_rfc3339(), generation=1)
        for key in ('deletionTimestamp', 'deletionGracePeriodSeconds', 'managedFields'):
            meta.pop(key, None)
        return obj

    def _admit(self, rtype: ResourceType, obj: dict[str, Any], old: dict[str, Any] | None,
               params: Mapping[str, str]) -> list[str]:
        """Prune/default, validate, check immutability. Returns warnings; raises ApiError."""
        warnings: list[str] = []
        name = obj['metadata'].get('name', '')
        if rtype.schema is not None or rtype.crd_name is not None:
            pruned, unknown = validation.prune_and_default(obj, rtype.schema)
            if unknown and params.get('fieldValidation') == 'Strict':
                raise bad_request('strict decoding error: ' + ', '.join(
                    f'unknown field "{field}"' for field in unknown))
            warnings += [f'unknown field "{field}"' for field in unknown]
            obj.clear()
            obj.update(pruned)
            causes = validation.validate_custom(obj, rtype.schema)
        else:
            causes = validation.validate_builtin(obj)
        causes += rules.metadata_errors(rtype.group_resource, obj['metadata'])
        if old is not None:
            causes += rules.immutable_errors(rtype.group_resource, old, obj)
        if rtype.group_resource == CRDS:
            causes += self._crd_errors(obj, old)
        if causes:
            raise invalid(rtype, name, causes)
        return warnings

    @staticmethod
    def _crd_errors(crd: Mapping[str, Any], old: Mapping[str, Any] | None) -> list[validation.Cause]:
        spec = crd.get('spec', {})
        causes = []
        expected = f'{spec.get("names", {}).get("plural")}.{spec.get("group")}'
        if crd['metadata'].get('name') != expected:
            causes.append(validation.Cause('metadata.name', f'must be spec.names.plural+"."+spec.group ({expected})'))
        if sum(bool(v.get('storage')) for v in spec.get('versions', [])) != 1:
            causes.append(validation.Cause('spec.versions', 'must have exactly one version marked as storage version'))
        if old is not None and old['spec'].get('scope') != spec.get('scope'):
            causes.append(validation.Cause('spec.scope', 'field is immutable'))
        return causes

    def _namespace_gate(self, rtype: ResourceType, ns: str | None) -> None:
        if not rtype.namespaced:
            return
        namespace = self._store.get(NAMESPACES, ('', ns or ''))
        if namespace is None:
            raise ApiError(404, 'NotFound', f'namespaces "{ns}" not found',
                           {'name': ns, 'kind': 'namespaces'})
        if namespace['metadata'].get('deletionTimestamp'):
            raise ApiError(403, 'Forbidden', f'{rtype.plural} "" is forbidden: unable to create new '
                           f'content in namespace {ns} because it is being terminated')

    def _create(self, rtype: ResourceType, ns: str | None, request: kmock.Request) -> aiohttp.web.Response:
        obj = copy.deepcopy(self._body(request))
        self._check_type(rtype, obj)
        meta = obj.setdefault('metadata', {})
        if not isinstance(meta, dict):
            raise bad_request('metadata must be an object')
        if rtype.namespaced:
            if meta.get('namespace') and meta['namespace'] != ns:
                raise bad_request('the namespace of the provided object does not match the '
                                  'namespace sent on the request')
            meta['namespace'] = ns
        else:
            meta.pop('namespace', None)
        if meta.get('resourceVersion'):
            raise bad_request('resourceVersion should not be set on objects to be created')
        if not meta.get('name'):
            if not meta.get('generateName'):
                raise invalid(rtype, '', [validation.Cause(
                    'metadata.name', 'name or generateName is required', 'FieldValueRequired')])
            meta['name'] = meta['generateName'] + ''.join(random.choices(_NAME_ALPHABET, k=5))
        self._namespace_gate(rtype, ns)
        if rtype.has_status:
            obj.pop('status', None)
        self._new_object_meta(obj)
        rules.apply_create_defaults(rtype.group_resource, obj)
        warnings = self._admit(rtype, obj, None, request.params)
        existing = self._store.get(rtype.group_resource, (ns or '', meta['name']))
        if existing is not None:
            raise ApiError(409, 'AlreadyExists', f'{rtype.qualified_name} "{meta["name"]}" already exists',
                           {'name': meta['name'], 'group': rtype.group, 'kind': rtype.plural})
        if request.params.get('dryRun') != 'All':
            self._store.put(rtype.group_resource, obj)
            self._after_write(rtype, None, obj)
        return _json(201, self._present(rtype, obj), warnings)

    def _update(self, rtype: ResourceType, ns: str | None, name: str, new: dict[str, Any],
                subresource: str | None, params: Mapping[str, str], *, replace: bool) -> aiohttp.web.Response:
        old = self._require(rtype, ns, name)
        self._check_type(rtype, new)
        meta = new.get('metadata')
        if not isinstance(meta, dict):
            raise bad_request('metadata must be an object')
        if meta.get('name', name) != name:
            raise bad_request(f'the name of the object ({meta.get("name")}) does not match the name '
                              f'on the URL ({name})')
        if rtype.namespaced and meta.get('namespace', ns) != ns:
            raise bad_request('the namespace of the provided object does not match the namespace '
                              'sent on the request')
        rv = meta.get('resourceVersion')
        if rv and rv != old['metadata']['resourceVersion']:
            raise ApiError(409, 'Conflict', f'Operation cannot be fulfilled on {rtype.qualified_name} '
                           f'"{name}": the object has been modified; please apply your changes to '
                           f'the latest version and try again',
                           {'name': name, 'group': rtype.group, 'kind': rtype.plural})
        if replace and not rv and rtype.crd_name is not None:
            raise invalid(rtype, name, [validation.Cause(
                'metadata.resourceVersion', 'Invalid value: 0x0: must be specified for an update')])
        if subresource == 'status':
            # Only the status changes through /status; everything else is the stored object's.
            new = {**copy.deepcopy(old), 'status': new.get('status')}
            if new['status'] is None:
                del new['status']
            meta = new['metadata']
        else:
            if rtype.has_status:
                new = {k: v for k, v in new.items() if k != 'status'}
                if 'status' in old:
                    new['status'] = copy.deepcopy(old['status'])
            for key in ('uid', 'creationTimestamp', 'deletionTimestamp',
                        'deletionGracePeriodSeconds', 'generation'):
                if key in old['metadata']:
                    meta[key] = old['metadata'][key]
                else:
                    meta.pop(key, None)
            meta['name'] = name
            if rtype.namespaced:
                meta['namespace'] = ns
        if old['metadata'].get('deletionTimestamp'):
            added = set(meta.get('finalizers') or []) - set(old['metadata'].get('finalizers') or [])
            if added:
                raise invalid(rtype, name, [validation.Cause(
                    'metadata.finalizers', f'Forbidden: no new finalizers can be added if the '
                    f'object is being deleted, found new finalizers {sorted(added)}')])
        warnings = self._admit(rtype, new, old, params)
        meta['resourceVersion'] = old['metadata']['resourceVersion']
        if _without_rv(new) == _without_rv(old):
            return _json(200, self._present(rtype, old), warnings)  # no-op: no new version, no event
        if _spec_part(new) != _spec_part(old) or (not rtype.has_status and new.get('status') != old.get('status')):
            meta['generation'] = int(old['metadata'].get('generation', 1)) + 1
        if params.get('dryRun') == 'All':
            return _json(200, self._present(rtype, new), warnings)
        if meta.get('deletionTimestamp') and not meta.get('finalizers'):
            gone = self._remove(rtype.group_resource, (ns or '', name))
            return _json(200, self._present(rtype, gone or new), warnings)
        self._store.put(rtype.group_resource, new)
        self._after_write(rtype, old, new)
        return _json(200, self._present(rtype, new), warnings)

    def _replace(self, rtype: ResourceType, ns: str | None, name: str, request: kmock.Request,
                 subresource: str | None) -> aiohttp.web.Response:
        return self._update(rtype, ns, name, copy.deepcopy(self._body(request)), subresource,
                            request.params, replace=True)

    def _patch(self, rtype: ResourceType, ns: str | None, name: str, request: kmock.Request,
               subresource: str | None) -> aiohttp.web.Response:
        old = self._require(rtype, ns, name)
        try:
            patch = json.loads(request.body) if request.body else None
        except ValueError as exc:
            raise bad_request(f'the body of the request was in an unknown format: {exc}') from None
        content_type = request.headers.get('Content-Type', '')
        try:
            patched = patching.apply_patch(content_type, copy.deepcopy(old), patch)
        except patching.PatchError as exc:
            raise ApiError(exc.status, {400: 'BadRequest', 415: 'UnsupportedMediaType'}.get(
                exc.status, 'Invalid'), str(exc)) from None
        if not isinstance(patched.get('metadata'), dict):
            raise bad_request('metadata must be an object')
        if patched['metadata'].get('resourceVersion') == old['metadata']['resourceVersion']:
            patched['metadata'].pop('resourceVersion')  # unchanged = no precondition
        return self._update(rtype, ns, name, patched, subresource, request.params, replace=False)

    def _after_write(self, rtype: ResourceType, old: dict[str, Any] | None, new: dict[str, Any]) -> None:
        if rtype.group_resource == CRDS:
            self._catalogue.install_crd(new)
            self._establish_crd(rtype, new)
        if new['metadata'].get('ownerReferences') and any(
                self._store.by_uid(uid) is None for uid in owner_uids(new)):
            self._gc_orphans.add((rtype.group_resource, (new['metadata'].get('namespace') or '',
                                                         new['metadata']['name'])))
            self._wake_gc()
        if rtype.group_resource == PODS and self._logs is not None:
            asyncio.get_running_loop().create_task(self._logs.notify())

    def _establish_crd(self, rtype: ResourceType, crd: dict[str, Any]) -> None:
        names = crd['spec']['names']
        accepted = {k: v for k, v in names.items()}
        status = {
            'acceptedNames': accepted,
            'storedVersions': sorted({*crd.get('status', {}).get('storedVersions', []),
                                      *[v['name'] for v in crd['spec']['versions'] if v.get('storage')]}),
            'conditions': [
                {'type': t, 'status': 'True', 'reason': r, 'message': m,
                 'lastTransitionTime': now_rfc3339()}
                for t, r, m in (('NamesAccepted', 'NoConflicts', 'no conflicts found'),
                                ('Established', 'InitialNamesAccepted', 'the initial names have been accepted'))],
        }
        if crd.get('status') != status:
            self._store.put(CRDS, {**crd, 'status': status})

    # -- deleting ----------------------------------------------------------------------------
    def _delete_options(self, request: kmock.Request) -> dict[str, Any]:
        options = dict(request.data) if isinstance(request.data, dict) else {}
        for key in ('propagationPolicy', 'gracePeriodSeconds', 'dryRun'):
            if key in request.params:
                options[key] = request.params[key]
        if 'orphanDependents' in options and 'propagationPolicy' not in options:
            options['propagationPolicy'] = 'Orphan' if options['orphanDependents'] else 'Background'
        policy = options.get('propagationPolicy', 'Background')
        if policy not in ('Background', 'Foreground', 'Orphan'):
            raise bad_request(f'propagationPolicy: Unsupported value: {policy!r}')
        return options

    def _delete_request(self, rtype: ResourceType, ns: str | None, name: str,
                        request: kmock.Request) -> aiohttp.web.Response:
        options = self._delete_options(request)
        obj = self._require(rtype, ns, name)
        pre = options.get('preconditions') or {}
        if (pre.get('uid') and pre['uid'] != obj['metadata']['uid']) or (
                pre.get('resourceVersion') and pre['resourceVersion'] != obj['metadata']['resourceVersion']):
            raise ApiError(409, 'Conflict', f'Operation cannot be fulfilled on {rtype.qualified_name} '
                           f'"{name}": Precondition failed', {'name': name, 'kind': rtype.plural})
        if options.get('dryRun') in ('All', ['All']):
            return _json(200, self._present(rtype, obj))
        result = self._delete(rtype.group_resource, (ns or '', name), options.get('propagationPolicy', 'Background'))
        return _json(200, self._present(rtype, result))

    def _delete_collection(self, rtype: ResourceType, ns: str | None, request: kmock.Request) -> aiohttp.web.Response:
        options = self._delete_options(request)
        selected = self._selectors(rtype, request.params)
        items = [o for o in self._store.items(rtype.group_resource, ns) if selected(o)]
        deleted = [self._delete(rtype.group_resource, (ns or '', o['metadata']['name']),
                                options.get('propagationPolicy', 'Background')) for o in items]
        return _json(200, {'kind': f'{rtype.kind}List', 'apiVersion': rtype.api_version,
                           'metadata': {'resourceVersion': str(self._store.rv)},
                           'items': [self._present(rtype, o) for o in deleted]})

    def _delete(self, gr: GroupResource, key: Key, policy: str) -> dict[str, Any]:
        """Delete now, or mark for deletion while finalizers (or dependents) remain."""
        obj = self._store.get(gr, key)
        assert obj is not None
        meta = obj['metadata']
        if meta.get('deletionTimestamp'):
            return obj
        if gr == NAMESPACES:
            policy = 'Background'  # the namespace controller empties it first, whatever asked
        if policy == 'Orphan':
            self._orphan_dependents(meta['uid'])
        finalizers = list(meta.get('finalizers') or [])
        if policy == 'Foreground' and 'foregroundDeletion' not in finalizers:
            finalizers.append('foregroundDeletion')
        namespace_terminating = gr == NAMESPACES
        if not finalizers and not namespace_terminating:
            return self._remove(gr, key) or obj
        marked = copy.deepcopy(obj)
        marked['metadata'].update(deletionTimestamp=now_rfc3339(), deletionGracePeriodSeconds=0)
        if finalizers:
            marked['metadata']['finalizers'] = finalizers
        if namespace_terminating:
            marked['status'] = {**marked.get('status', {}), 'phase': 'Terminating'}
            self._gc_namespaces.add(key[1])
        if 'foregroundDeletion' in finalizers:
            self._gc_foreground.add((gr, key))
        self._store.put(gr, marked)
        self._wake_gc()
        return marked

    def _orphan_dependents(self, uid: str) -> None:
        for gr, key in self._store.dependents_of(uid):
            dependent = copy.deepcopy(self._store.get(gr, key))
            if dependent is None:
                continue
            refs = [r for r in dependent['metadata'].get('ownerReferences', []) if r.get('uid') != uid]
            if refs:
                dependent['metadata']['ownerReferences'] = refs
            else:
                dependent['metadata'].pop('ownerReferences', None)
            self._store.put(gr, dependent)

    def _remove(self, gr: GroupResource, key: Key) -> dict[str, Any] | None:
        gone = self._store.remove(gr, key)
        if gone is None:
            return None
        uid = gone['metadata']['uid']
        self._gc_orphans.update(self._store.dependents_of(uid))
        if gr == CRDS:
            spec = gone['spec']
            self._catalogue.remove_crd(gone['metadata']['name'])
            self._store.drop_group_resource((spec['group'], spec['names']['plural']))
        if gr == PODS and self._logs is not None:
            asyncio.get_running_loop().create_task(self._logs.forget_pod(*key))
        self._wake_gc()
        return gone

    # -- garbage collection ------------------------------------------------------------------
    def _wake_gc(self) -> None:
        if self._gc_wakeup is not None:
            self._gc_wakeup.set()

    async def _gc_loop(self) -> None:
        assert self._gc_wakeup is not None
        while True:
            await self._gc_wakeup.wait()
            self._gc_wakeup.clear()
            await asyncio.sleep(self.gc_delay)  # real collectors are asynchronous too
            self.collect_garbage()

    def collect_garbage(self) -> None:
        """One pass of the garbage collector and the namespace controller (idempotent)."""
        progress = True
        while progress:
            progress = False
            for gr, key in list(self._gc_orphans):
                self._gc_orphans.discard((gr, key))
                obj = self._store.get(gr, key)
                uids = owner_uids(obj) if obj else set()
                if obj and uids and all(self._store.by_uid(uid) is None for uid in uids):
                    self._delete(gr, key, 'Background')
                    progress = True
            for gr, key in list(self._gc_foreground):
                progress |= self._finish_foreground(gr, key)
            for name in list(self._gc_namespaces):
                progress |= self._finish_namespace(name)

    def _finish_foreground(self, gr: GroupResource, key: Key) -> bool:
        obj = self._store.get(gr, key)
        if obj is None or 'foregroundDeletion' not in (obj['metadata'].get('finalizers') or []):
            self._gc_foreground.discard((gr, key))
            return False
        dependents = self._store.dependents_of(obj['metadata']['uid'])
        if dependents:
            changed = False
            for dep_gr, dep_key in dependents:
                dep = self._store.get(dep_gr, dep_key)
                if dep is not None and not dep['metadata'].get('deletionTimestamp'):
                    self._delete(dep_gr, dep_key, 'Foreground')
                    changed = True
            return changed
        self._gc_foreground.discard((gr, key))
        released = copy.deepcopy(obj)
        released['metadata']['finalizers'] = [f for f in obj['metadata']['finalizers']
                                              if f != 'foregroundDeletion']
        if released['metadata']['finalizers']:
            self._store.put(gr, released)
        else:
            self._remove(gr, key)
        return True

    def _finish_namespace(self, name: str) -> bool:
        namespace = self._store.get(NAMESPACES, ('', name))
        if namespace is None:
            self._gc_namespaces.discard(name)
            return False
        refs = self._store.namespaced_refs(name)
        if refs:
            changed = False
            for gr, key in refs:
                obj = self._store.get(gr, key)
                if obj is not None and not obj['metadata'].get('deletionTimestamp'):
                    self._delete(gr, key, 'Background')
                    changed = True
            return changed
        self._gc_namespaces.discard(name)
        if not namespace['metadata'].get('finalizers'):
            self._remove(NAMESPACES, ('', name))
        return True

    # -- pod logs ----------------------------------------------------------------------------
    async def _pod_log(self, raw: aiohttp.web.BaseRequest, rtype: ResourceType, ns: str, name: str,
                       params: Mapping[str, str]) -> aiohttp.web.StreamResponse:
        pod = self._require(rtype, ns, name)
        container = self._log_container(pod, params.get('container'))
        if container_state(pod, container) == 'waiting':
            raise bad_request(f'container "{container}" in pod "{name}" is waiting to start: '
                              f'ContainerCreating')
        try:
            query = LogQuery.from_params(dict(params))
        except ValueError as exc:
            raise bad_request(f'invalid log options: {exc}') from None
        assert self._logs is not None
        key = (ns, name, container)
        if params.get('follow') not in ('true', '1'):
            return aiohttp.web.Response(status=200, text=query.render(self._logs.lines(key)),
                                        content_type='text/plain')
        response = aiohttp.web.StreamResponse(status=200)
        response.content_type = 'text/plain'
        try:
            await response.prepare(raw)
            sent = 0
            while not self._closing:
                lines = self._logs.lines(key)
                if sent == 0 and query.tail_lines is not None:
                    sent = max(0, len(lines) - query.tail_lines)
                    query = LogQuery(query.timestamps, query.since_time, None, None)
                if len(lines) > sent:
                    await response.write(query.render(lines[sent:]).encode())
                    sent = len(lines)
                current = self._store.get(PODS, (ns, name))
                if current is None or container_state(current, container) == 'terminated':
                    break
                if raw.transport is None or raw.transport.is_closing():
                    return response
                async with self._logs.changed:
                    try:
                        await asyncio.wait_for(self._logs.changed.wait(), timeout=1.0)
                    except asyncio.TimeoutError:
                        pass
            await response.write_eof()
        except (ConnectionError, RuntimeError):
            pass
        return response

    @staticmethod
    def _log_container(pod: Mapping[str, Any], requested: str | None) -> str:
        name = pod['metadata']['name']
        containers = [c['name'] for c in pod.get('spec', {}).get('containers', [])]
        if requested is None:
            if len(containers) != 1:
                raise bad_request(f'a container name must be specified for pod {name}, choose one '
                                  f'of: [{" ".join(containers)}]')
            return containers[0]
        if requested not in containers + [c['name'] for c in pod.get('spec', {}).get('initContainers', [])]:
            raise bad_request(f'container {requested} is not valid for pod {name}')
        return requested

    # -- for tests: things with no API -------------------------------------------------------
    async def append_log(self, namespace: str, pod: str, text: str, container: str | None = None,
                         when: datetime.datetime | None = None) -> None:
        obj = self._store.get(PODS, (namespace, pod))
        if obj is None:
            raise KeyError(f'no pod {namespace}/{pod}')
        assert self._logs is not None
        await self._logs.append((namespace, pod, self._log_container(obj, container)), text, when)

    def compact(self) -> None:
        """Forget watch history, as etcd compaction does: older resourceVersions get 410 Gone."""
        self._store.compact()

    @property
    def resource_version(self) -> int:
        return self._store.rv

    def snapshot(self) -> dict[str, list[dict[str, Any]]]:
        """All stored objects as {'group/plural': [objects]} (a copy, for assertions/debugging)."""
        result: dict[str, list[dict[str, Any]]] = {}
        for gr, key in self._store.all_refs():
            obj = self._store.get(gr, key)
            if obj is not None:
                result.setdefault(f'{gr[0]}/{gr[1]}' if gr[0] else gr[1], []).append(copy.deepcopy(obj))
        return result


class EmulatorThread:
    """Serves a RealisticKubernetes on 127.0.0.1 from its own thread and event loop.

    The sync kubernetes client blocks its caller, so the server must not share the test's
    loop. ``call(coro_fn)`` runs a coroutine on the server's loop (for helpers with no API).
    """

    def __init__(self, port: int = 0, **options: Any) -> None:
        self._port = port
        self._options = options
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, name='kube-emulator', daemon=True)
        self._error: BaseException | None = None
        self.emulator: RealisticKubernetes | None = None
        self.url = ''

    def start(self) -> 'EmulatorThread':
        self._thread.start()
        self._ready.wait(30)
        if self._error is not None:
            raise RuntimeError('the Kubernetes emulator failed to start') from self._error
        return self

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._serve())
        except BaseException as exc:  # noqa: BLE001 - reported to the starting thread
            self._error = exc
            self._ready.set()

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        async with RealisticKubernetes(**self._options) as emulator:
            async with kmock.Server(emulator, port=self._port or None) as server:
                self.emulator = emulator
                self.url = str(server.url).rstrip('/')
                self._ready.set()
                await self._stop.wait()
                await emulator.close_streams()  # or the HTTP server waits for open watches

    def call(self, fn: Callable[[RealisticKubernetes], Awaitable[T] | T], timeout: float = 30) -> T:
        """Run ``fn(emulator)`` on the emulator's loop (awaiting it if it is a coroutine)."""
        async def runner() -> T:
            assert self.emulator is not None
            result = fn(self.emulator)
            return await result if isinstance(result, Awaitable) else result
        return asyncio.run_coroutine_threadsafe(runner(), self._loop).result(timeout)

    def stop(self) -> None:
        if self._stop is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop.set)
            self._thread.join(30)


def kubeconfig(url: str, namespace: str = 'default') -> dict[str, Any]:
    return {
        'apiVersion': 'v1', 'kind': 'Config', 'current-context': 'emulator',
        'clusters': [{'name': 'emulator', 'cluster': {'server': url}}],
        'users': [{'name': 'tester', 'user': {'token': 'emulator-token'}}],
        'contexts': [{'name': 'emulator', 'context': {'cluster': 'emulator', 'user': 'tester',
                                                      'namespace': namespace}}],
    }
