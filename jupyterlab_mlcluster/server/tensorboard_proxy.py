"""The authenticated way to a TensorBoard the server started (server/tensorboard.py):
`/mlcluster/tensorboard/<key>/...` under the server's base URL, streamed to the process on
loopback with the secret it alone answers (tensorboard_launch.SECRET_HEADER). A header of
that name from the browser is dropped, never passed on.
"""

from __future__ import annotations

from typing import Any

from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import JupyterHandler
from tornado import httpclient, web

from .identity import IdentityError
from .tensorboard import PROXY_PREFIX, TensorBoardProcess, inner_prefix
from .tensorboard_launch import SECRET_HEADER

# Headers that describe one hop, not the message (RFC 9110 7.6.1), and ones tornado sets.
_HOP_HEADERS = {
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "content-length",
    "host",
    "cookie",
    "authorization",
    SECRET_HEADER.lower(),
}


class TensorBoardProxy(JupyterHandler):
    """`/mlcluster/tensorboard/<key>/...` -> that TensorBoard, for an authenticated caller
    allowed to see its jobs. Responses are streamed, not buffered."""

    auth_resource = "mlcluster"

    @property
    def app(self):
        return self.settings["mlcluster"]

    def check_xsrf_cookie(self) -> None:
        # TensorBoard's own pages POST with the header `X-XSRF-Protected: 1` (TensorBoard
        # refuses POSTs without it). A page of another origin cannot send a custom header
        # without a CORS preflight, which Jupyter Server answers without allowing it; so the
        # header proves the request comes from this origin, as Jupyter's _xsrf would.
        if self.request.headers.get("X-XSRF-Protected") == "1":
            return None
        return super().check_xsrf_cookie()

    def _target(self, key: str) -> TensorBoardProcess:
        current = self.app.tensorboards.touch(key)
        if current is None:
            raise web.HTTPError(404, f"no TensorBoard {key!r} (stopped when idle: open it again)")
        if self.app.trust_identity_header:
            try:
                caller = self.app.user_identity(self.current_user, self.request.headers)
            except IdentityError as exc:
                raise web.HTTPError(403, str(exc)) from None
            if caller != current.owner:
                raise web.HTTPError(404, f"no TensorBoard {key!r}")
        return current

    async def _forward(self, key: str, rest: str) -> None:
        current = self._target(key)
        if not rest:  # its pages link relatively: they need the directory's URL
            self.redirect(self.app.tensorboards.path(key))
            return
        url = f"http://127.0.0.1:{current.port}{inner_prefix(key)}{rest}"
        if self.request.query:
            url += "?" + self.request.query
        headers = {k: v for k, v in self.request.headers.get_all() if k.lower() not in _HOP_HEADERS}
        headers[SECRET_HEADER] = current.secret
        started = False

        def on_header(line: str) -> None:
            nonlocal started
            line = line.strip()
            if not line:
                return
            if line.startswith("HTTP/"):
                parts = line.split(" ", 2)
                self.set_status(int(parts[1]), parts[2] if len(parts) > 2 else None)
                self.clear_header("Content-Type")
                return
            name, _, value = line.partition(":")
            if name.lower() == "location" and value.strip().startswith(inner_prefix(key)):
                outer = self.app.tensorboards.path(key).rstrip("/")
                value = outer + value.strip()[len(inner_prefix(key)) :]
            if name.lower() not in _HOP_HEADERS:
                self.add_header(name.strip(), value.strip())

        def on_chunk(chunk: bytes) -> None:
            nonlocal started
            started = True
            self.write(chunk)
            self.flush()

        body = self.request.body if self.request.method in ("POST", "PUT") else None
        request = httpclient.HTTPRequest(
            url,
            method=self.request.method,
            headers=headers,
            body=body,
            follow_redirects=False,
            header_callback=on_header,
            streaming_callback=on_chunk,
            request_timeout=300,
            decompress_response=False,
        )
        try:
            await httpclient.AsyncHTTPClient().fetch(request, raise_error=False)
        except Exception as exc:  # connection refused: TensorBoard died under us
            if started:
                raise
            raise web.HTTPError(502, f"TensorBoard {key!r} did not answer: {exc}") from None
        self.finish()

    @web.authenticated
    @authorized
    async def get(self, key: str, rest: str) -> None:
        await self._forward(key, rest)

    @web.authenticated
    @authorized
    async def post(self, key: str, rest: str) -> None:
        await self._forward(key, rest)


def proxy_routes() -> list[tuple[str, Any]]:
    # ExtensionApp puts the server's base URL before the pattern.
    return [(PROXY_PREFIX + r"/([a-z0-9-]+)(/.*)?", TensorBoardProxy)]
