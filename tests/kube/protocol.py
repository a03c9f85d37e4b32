"""How the emulated API talks HTTP: resource paths, ``Status`` errors, JSON replies."""

from __future__ import annotations

import datetime
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp.web

from . import validation
from .catalogue import ResourceType

_NOW: list[Any] = [None, ""]  # the second now_rfc3339 last formatted, and its text


def now_rfc3339() -> str:
    """The time to the second, as the API writes timestamps (formatted once a second: a
    burst of writes asks for it thousands of times a second)."""
    second = int(time.time())
    if _NOW[0] != second:
        moment = datetime.datetime.fromtimestamp(second, datetime.UTC)
        _NOW[:] = [second, moment.strftime("%Y-%m-%dT%H:%M:%SZ")]
    return str(_NOW[1])


class ApiError(Exception):
    """An API failure, rendered as a ``Status`` object."""

    def __init__(
        self, code: int, reason: str, message: str, details: Mapping[str, Any] | None = None
    ) -> None:
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details

    def status(self) -> dict[str, Any]:
        body = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.details:
            body["details"] = dict(self.details)
        return body


def not_found(rtype: ResourceType, name: str) -> ApiError:
    return ApiError(
        404,
        "NotFound",
        f'{rtype.qualified_name} "{name}" not found',
        {"name": name, "group": rtype.group, "kind": rtype.plural},
    )


def invalid(rtype: ResourceType, name: str, causes: list[validation.Cause]) -> ApiError:
    text = ", ".join(f"{c.field}: {c.message}" for c in causes)
    group_kind = f"{rtype.kind}.{rtype.group}" if rtype.group else rtype.kind
    return ApiError(
        422,
        "Invalid",
        f'{group_kind} "{name}" is invalid: [{text}]',
        {
            "name": name,
            "group": rtype.group,
            "kind": rtype.kind,
            "causes": [
                {"reason": c.reason, "message": c.message, "field": c.field} for c in causes
            ],
        },
    )


def bad_request(message: str) -> ApiError:
    return ApiError(400, "BadRequest", message)


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
    parts = [part for part in path.split("/") if part]
    if len(parts) >= 3 and parts[0] == "api":
        group, version, rest = "", parts[1], parts[2:]
    elif len(parts) >= 4 and parts[0] == "apis":
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        return None
    namespace = None
    if rest[0] == "namespaces" and len(rest) >= 3:
        namespace, rest = rest[1], rest[2:]
    plural, name, sub = rest[0], (rest[1] if len(rest) > 1 else None), rest[2:]
    return ApiPath(group, version, plural, namespace, name, "/".join(sub) or None)


def json_reply(status: int, body: Any, warnings: list[str] | None = None) -> aiohttp.web.Response:
    return text_reply(status, json.dumps(body), warnings)


def text_reply(status: int, text: str, warnings: list[str] | None = None) -> aiohttp.web.Response:
    """A reply of JSON already serialized."""
    headers = (
        {"Warning": ", ".join(f"299 - {json.dumps(w)}" for w in warnings)} if warnings else None
    )
    return aiohttp.web.Response(
        status=status, text=text, content_type="application/json", headers=headers
    )
