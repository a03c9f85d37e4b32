"""REST handler of `/jobs/{id}/export` (POST): what runs a job again outside the notebook,
as one zip (export/). The job's files are read, nothing loaded: its pushed variables travel
as the job stored them, never unpickled here."""

from __future__ import annotations

from jupyter_server.auth.decorator import authorized
from tornado import web

from ...export import ExportError, export_files, export_zip
from .base import MLClusterHandler


class JobExportHandler(MLClusterHandler):
    api_path = "/jobs/{id}/export"

    @web.authenticated
    @authorized("read")  # nothing changes: the job's own files, rearranged
    async def post(self, ref: str) -> None:
        q = self.query()
        record = await self.job(ref)  # another user's: 404, as a missing one
        target = q["as"]
        scope = self.scope()

        def build() -> bytes:
            files = export_files(
                self.app.service, record.id, target, owner=scope, image=q.get("image")
            )
            return export_zip(files)

        try:
            data = await self.run(build)
        except ExportError as exc:
            raise web.HTTPError(400, str(exc)) from None
        self.set_header("Content-Type", "application/zip")
        self.set_header("Content-Disposition", f'attachment; filename="{record.name}-{target}.zip"')
        # Jupyter's APIHandler.finish would call it JSON: tornado's own finish sends it as is.
        web.RequestHandler.finish(self, data)
