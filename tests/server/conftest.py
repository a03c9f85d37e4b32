"""Fixtures for the server extension: an in-process Jupyter server (pytest-jupyter) with the
extension enabled on a fresh job store, and real `jupyter server` subprocesses."""

from __future__ import annotations

import json
from typing import Any

import pytest

# pytest-jupyter's fixtures (jp_serverapp, jp_fetch, jp_ws_fetch, ...) and its runner for
# `async def` tests, for this directory only (it is not an auto-loaded plugin).
from pytest_jupyter.jupyter_server import *

from tests.helpers import rest_call

from .live import LiveServer


@pytest.fixture
def mlc_config() -> dict[str, Any]:
    """Extra traitlets config for the server under test (tests override this fixture)."""
    return {}


@pytest.fixture
def jp_server_config(store_dir, monkeypatch, mlc_config):
    monkeypatch.setenv("MLCLUSTER_WARM_POOL", "0")
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    config = {"ServerApp": {"jpserver_extensions": {"jupyterlab_mlcluster": True}}}
    for section, values in mlc_config.items():
        config.setdefault(section, {}).update(values)
    return config


@pytest.fixture
def mlc(jp_serverapp, jp_asyncio_loop):
    """The running MLClusterApp (its start hook run, as `jupyter server` would)."""
    app = jp_serverapp.extension_manager.extension_points["mlcluster"].app
    jp_asyncio_loop.run_until_complete(app._start_jupyter_server_extension(jp_serverapp))
    yield app
    # Nothing of any job may outlive the test.
    from helpers import assert_no_job_processes

    for record in app.service.store.list_jobs()[0]:
        if not record.final:
            app.service.cancel(record.id)
    assert_no_job_processes(app.service)


@pytest.fixture
def api(jp_fetch, mlc):
    """`await api("GET", "jobs", params=...)` -> (status, decoded JSON or None, response)."""

    async def call(method: str, *path: str, body: Any = None, params=None, headers=None, **kwargs):
        response = await rest_call(
            jp_fetch, method, *path, body=body, params=params, headers=headers, **kwargs
        )
        text = response.body.decode() if response.body else ""
        data = (
            json.loads(text)
            if text and response.headers.get("Content-Type", "").startswith("application/json")
            else None
        )
        return response.code, data, response

    return call


@pytest.fixture
def live_server(tmp_path, store_dir):
    """Factory: `live_server(*extra_args)` starts a real server; all are stopped at the end."""
    servers: list[LiveServer] = []

    def start(*extra_args: str) -> LiveServer:
        server = LiveServer(tmp_path / "home", store_dir, list(extra_args)).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()
    # Whatever the servers left running (they leave jobs running by design) is stopped here.
    from helpers import assert_no_job_processes

    from jupyterlab_mlcluster.jobs.service import JobService

    service = JobService()
    for record in service.store.list_jobs()[0]:
        if not record.final:
            service.cancel(record.id)
    assert_no_job_processes(service)
