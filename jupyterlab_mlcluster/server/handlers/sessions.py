"""REST handlers for sessions (`/mlcluster/api/sessions`): list, get, stop, restart.

A session is its owner's: every lookup is by (owner, name), the owner being the caller when
the server trusts an identity header (a server shared by several users), so another user's
session answers 404 exactly as a missing one. On a personal server (no header) its one
user's sessions are all there are. Blocking work (the store) runs in the executor; a
stop's or a restart's wait for the ranks on the event loop, holding no thread.
"""

from __future__ import annotations

from typing import Any

from jupyter_server.auth.decorator import authorized
from tornado import web

from ... import patterns
from ...jobs import sessions
from ...jobs.service import STOP_SLACK
from .base import MLClusterHandler


class SessionHandlerBase(MLClusterHandler):
    async def call(self, fn, name: str | None = None, **kwargs: Any) -> Any:
        if name is not None and not patterns.matches(patterns.SESSION_NAME, name):
            raise web.HTTPError(404, f"no session {name!r}")
        args = (self.app.service, self.scope()) + ((name,) if name is not None else ())
        try:
            return await self.run(fn, *args, **kwargs)
        except sessions.UnknownSession:
            raise web.HTTPError(404, f"no session {name!r}") from None
        except sessions.SessionError as exc:
            raise web.HTTPError(409, str(exc)) from None


class SessionsHandler(SessionHandlerBase):
    api_path = "/sessions"

    @web.authenticated
    @authorized("read")
    async def get(self) -> None:
        infos = await self.call(sessions.list_sessions)
        self.send({"sessions": [info.to_json() for info in infos]})


class SessionHandler(SessionHandlerBase):
    api_path = "/sessions/{name}"

    @web.authenticated
    @authorized("read")
    async def get(self, name: str) -> None:
        self.send((await self.call(sessions.get_session, name)).to_json())

    @web.authenticated
    @authorized("write")
    async def delete(self, name: str) -> None:
        # Asked in the executor, waited for on the event loop (the ranks' grace, then the
        # wedged case's kill in the executor, as a blocking stop would).
        info = await self.call(sessions.stop_session, name, wait=False)
        holder = await self.wait_for_job(
            info.holder.id,
            lambda record: record.final,
            await self.run(self.app.service.job_grace, info.holder.id) + STOP_SLACK,
        )
        if not holder.final:
            await self.run(self.app.service.cancel, holder.id, wait=True)
        self.send((await self.call(sessions.session_info, name)).to_json())


class SessionRestartHandler(SessionHandlerBase):
    api_path = "/sessions/{name}/restart"

    @web.authenticated
    @authorized("write")
    async def post(self, name: str) -> None:
        holder_id, before = await self.call(sessions.request_restart, name)
        record = await self.wait_for_job(
            holder_id, lambda r: sessions.restarted(r, before), sessions.RESTART_WAIT
        )
        if not sessions.restarted(record, before):
            raise web.HTTPError(
                409, f"session {name!r} did not restart within {sessions.RESTART_WAIT:g} s"
            )
        self.send((await self.call(sessions.session_info, name)).to_json())
