"""REST handlers of the caller's notebook servers on Kubernetes: `/notebooks`,
`/notebooks/{name}`, `/notebooks/{name}/stop|start` (server/notebooks.py does the work).
"""

from __future__ import annotations

import json
from typing import Any

from jupyter_server.auth.decorator import authorized
from tornado import web

from ...kubeconn import ClusterUnavailable, KubeError
from ..notebooks import (
    InvalidNotebook,
    NotebookExists,
    NotebookNotFound,
    QuotaExceeded,
    notebook_name_error,
)
from ..user_namespace import NamespaceTaken
from .base import MLClusterHandler


class NotebookHandlerBase(MLClusterHandler):
    """The caller's own notebook servers. Another user's look exactly like missing ones (404),
    so nobody learns which names others use."""

    async def call(self, method: str, *args: Any) -> Any:
        owner = self.caller()
        try:
            return await self.run(getattr(self.app.notebooks, method), owner, *args)
        except InvalidNotebook as exc:
            raise web.HTTPError(400, str(exc)) from None
        except NotebookNotFound as exc:
            raise web.HTTPError(404, str(exc)) from None
        except NotebookExists as exc:
            raise web.HTTPError(409, str(exc)) from None
        except (QuotaExceeded, NamespaceTaken) as exc:
            raise web.HTTPError(403, str(exc)) from None
        except ClusterUnavailable as exc:
            raise web.HTTPError(503, str(exc)) from None
        except KubeError as exc:  # the API server answered, and refused
            raise web.HTTPError(502, str(exc)) from None


class NotebooksHandler(NotebookHandlerBase):
    api_path = "/notebooks"

    @web.authenticated
    @authorized("read")
    async def get(self) -> None:
        self.send({"notebooks": await self.call("list")})

    @web.authenticated
    @authorized("write")
    async def post(self) -> None:
        created = await self.call("create", self.spawn_request())
        self.set_header("Location", self.api_url("notebooks", created["name"]))
        self.send(created, status=201)

    def spawn_request(self) -> dict[str, Any]:
        """The validated body; a bad name is refused in the name validator's own words."""
        try:
            return self.json_body()
        except web.HTTPError:
            name = _json_field(self.body, "name")
            problem = notebook_name_error(name) if isinstance(name, str) else None
            if problem:
                raise web.HTTPError(400, f"name: {problem}") from None
            raise


class NamedNotebookHandler(NotebookHandlerBase):
    async def call_named(self, method: str, name: str) -> Any:
        problem = notebook_name_error(name)
        if problem:
            raise web.HTTPError(400, problem)
        return await self.call(method, name)


class NotebookHandler(NamedNotebookHandler):
    api_path = "/notebooks/{name}"

    @web.authenticated
    @authorized("read")
    async def get(self, name: str) -> None:
        self.send(await self.call_named("get", name))

    @web.authenticated
    @authorized("write")
    async def delete(self, name: str) -> None:
        await self.call_named("delete", name)
        self.set_status(204)
        self.finish()


class NotebookStopHandler(NamedNotebookHandler):
    api_path = "/notebooks/{name}/stop"

    @web.authenticated
    @authorized("write")
    async def post(self, name: str) -> None:
        self.send(await self.call_named("stop", name))


class NotebookStartHandler(NamedNotebookHandler):
    api_path = "/notebooks/{name}/start"

    @web.authenticated
    @authorized("write")
    async def post(self, name: str) -> None:
        self.send(await self.call_named("start", name))


def _json_field(raw: bytes, key: str) -> Any:
    """`key` of a JSON object body, or None when the body is no such thing."""
    try:
        value = json.loads(raw or b"null")
    except (ValueError, RecursionError):
        return None
    return value.get(key) if isinstance(value, dict) else None
