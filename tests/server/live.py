"""A real `jupyter server` process with the extension enabled, for tests and benchmarks."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from tests.helpers import free_port, stop_process

REPO = Path(__file__).resolve().parents[2]
TOKEN = "mlcluster-test-token"


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

    def start(self, timeout: float = 60.0, ready_path: str = "") -> LiveServer:
        """Start it and wait until it answers GET /cluster (or Jupyter's `ready_path`, for a
        server whose API refuses this helper's token, such as one that verifies JWTs)."""
        (self.home / "root").mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")  # the child owns it
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "jupyter_server",
                "--no-browser",
                "--allow-root",
                f"--port={self.port}",
                "--ip=127.0.0.1",
                "--port-retries=0",
                *(
                    []  # the test sets its own (e.g. none, as a gateway-fronted server runs)
                    if any(a.startswith("--IdentityProvider.token=") for a in self.extra_args)
                    else [f"--IdentityProvider.token={TOKEN}"]
                ),
                f"--ServerApp.root_dir={self.home / 'root'}",
                *self.extra_args,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=self.env(),
            cwd=self.home,
        )
        log.close()
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise AssertionError(f"jupyter server exited:\n{self.log_path.read_text()[-3000:]}")
            try:
                if ready_path:
                    urllib.request.urlopen(f"{self.url}/{ready_path}", timeout=5).close()
                else:
                    self.request("GET", "cluster")
                return self
            except (urllib.error.URLError, ConnectionError, OSError) as exc:
                if time.monotonic() > deadline:
                    raise AssertionError(
                        f"jupyter server did not start:\n{self.log_path.read_text()[-3000:]}"
                    ) from exc
                time.sleep(0.2)

    def request(
        self, method: str, path: str, body: Any = None, token: str | None = TOKEN
    ) -> tuple[int, Any]:
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
        if self.proc:
            stop_process(self.proc, grace=20)
