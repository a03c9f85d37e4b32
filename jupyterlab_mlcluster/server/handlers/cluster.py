"""REST handlers of the server itself: `/cluster` (backends' capacity and use) and
`/openapi.json` (the document the routes implement, with this server's URL).
"""

from __future__ import annotations

from jupyter_server.auth.decorator import authorized
from tornado import web

from .base import MLClusterHandler


class ClusterHandler(MLClusterHandler):
    api_path = "/cluster"

    @web.authenticated
    @authorized("read")
    async def get(self) -> None:
        scope = self.scope()
        await self.send_encoded(lambda: self.app.service.cluster(owner=scope))


class OpenAPIHandler(MLClusterHandler):
    api_path = "/openapi.json"

    @web.authenticated
    @authorized("read")
    async def get(self) -> None:
        document = dict(self.app.document)
        document["servers"] = [{"url": self.api_url()}]
        self.send(document)
