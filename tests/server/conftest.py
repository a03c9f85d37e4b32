"""Fixtures for the server extension: an in-process Jupyter server (pytest-jupyter) with the
extension enabled on a fresh job store, and real `jupyter server` subprocesses."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

# pytest-jupyter's fixtures (jp_serverapp, jp_fetch, jp_ws_fetch, ...) and its runner for
# `async def` tests, for this directory only (it is not an auto-loaded plugin).
from pytest_jupyter.jupyter_server import *  # noqa: F401,F403

REPO = Path(__file__).resolve().parents[2]
TOKEN = "mlcluster-test-token"


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
    from conftest import assert_no_job_processes

    for record in app.service.store.list_jobs()[0]:
        if not record.final:
            app.service.cancel(record.id)
    assert_no_job_processes(app.service)


@pytest.fixture
def api(jp_fetch, mlc):
    """`await api("GET", "jobs", params=...)` -> (status, decoded JSON or None, response)."""

    async def call(method: str, *path: str, body: Any = None, params=None, headers=None, **kwargs):
        if body is not None and not isinstance(body, (str, bytes)):
            body = json.dumps(body)
        if body is None and method in ("POST", "PUT", "PATCH"):
            body = ""
        response = await jp_fetch(
            "mlcluster", "api", *path, method=method, body=body, params=params, headers=headers,
            raise_error=False, allow_nonstandard_methods=True, **kwargs,
        )
        text = response.body.decode() if response.body else ""
        data = json.loads(text) if text and response.headers.get("Content-Type", "").startswith("application/json") else None
        return response.code, data, response

    return call


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LiveServer:
    """A real `jupyter server` process with the extension, on a given job store."""

    def __init__(self, home: Path, store: Path, extra_args: list[str] = ()):
        self.home = home
        self.store = store
        self.extra_args = list(extra_args)
        self.port = free_port()
        self.proc: subprocess.Popen | None = None
        self.log_path = home / f"server-{self.port}.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        config_dir = self.home / "config"
        config_dir.mkdir(parents=True, exist_ok=True)
        (config_dir / "jupyter_server_config.json").write_text(
            json.dumps({"ServerApp": {"jpserver_extensions": {"jupyterlab_mlcluster": True}}})
        )
        env = {k: v for k, v in os.environ.items() if not k.startswith(("JUPYTER", "KUBE"))}
        env.update(
            HOME=str(self.home),
            JUPYTER_CONFIG_DIR=str(config_dir),
            JUPYTER_DATA_DIR=str(self.home / "data"),
            JUPYTER_RUNTIME_DIR=str(self.home / "runtime"),
            MLCLUSTER_STORE_DIR=str(self.store),
            MLCLUSTER_WARM_POOL="0",
            PYTHONPATH=os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
        )
        return env

    def start(self, timeout: float = 60.0) -> "LiveServer":
        (self.home / "root").mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")  # noqa: SIM115 - the child owns it
        self.proc = subprocess.Popen(
            [
                sys.executable, "-m", "jupyter_server", "--no-browser", "--allow-root",
                f"--port={self.port}", "--ip=127.0.0.1", "--port-retries=0",
                f"--IdentityProvider.token={TOKEN}", f"--ServerApp.root_dir={self.home / 'root'}",
                *self.extra_args,
            ],
            stdout=log, stderr=subprocess.STDOUT, env=self.env(), cwd=self.home,
        )
        log.close()
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise AssertionError(f"jupyter server exited:\n{self.log_path.read_text()[-3000:]}")
            try:
                self.request("GET", "cluster")
                return self
            except (urllib.error.URLError, ConnectionError, OSError):
                if time.monotonic() > deadline:
                    raise AssertionError(f"jupyter server did not start:\n{self.log_path.read_text()[-3000:]}")
                time.sleep(0.2)

    def request(self, method: str, path: str, body: Any = None, token: str | None = TOKEN) -> tuple[int, Any]:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(f"{self.url}/mlcluster/api/{path}", data=data, method=method)
        if token:
            req.add_header("Authorization", f"token {token}")
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                raw = resp.read()
                return resp.status, json.loads(raw) if raw else None
        except urllib.error.HTTPError as err:
            raw = err.read()
            return err.code, json.loads(raw) if raw else None

    def kill(self, signum: int = signal.SIGKILL) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signum)
            self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


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
    from conftest import assert_no_job_processes

    from jupyterlab_mlcluster.jobs.service import JobService

    service = JobService()
    for record in service.store.list_jobs()[0]:
        if not record.final:
            service.cancel(record.id)
    assert_no_job_processes(service)
