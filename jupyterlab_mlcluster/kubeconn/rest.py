"""REST paths of resources and the plain-JSON encoding both front ends (blocking and
asyncio) share: query parameters in, decoded answers out."""

from __future__ import annotations

import json
from typing import Any

MERGE_PATCH = "application/merge-patch+json"


def resource_path(
    api_version: str,
    plural: str,
    namespace: str | None = None,
    name: str | None = None,
    subresource: str | None = None,
) -> str:
    """The REST path of a resource collection, object or subresource."""
    path = f"/apis/{api_version}" if "/" in api_version else f"/api/{api_version}"
    if namespace:
        path += f"/namespaces/{namespace}"
    path += f"/{plural}"
    if name:
        path += f"/{name}"
    return f"{path}/{subresource}" if subresource else path


def _query(query: dict[str, Any] | None) -> list[tuple[str, str]]:
    def text(value: Any) -> str:
        return ("true" if value else "false") if isinstance(value, bool) else str(value)

    return [(k, text(v)) for k, v in (query or {}).items() if v is not None]


def _decode(data: bytes | None) -> Any:
    if not data:
        return {}
    try:
        return json.loads(data)
    except ValueError:
        return data.decode("utf-8", "replace")
