"""The server extension's notebook-server API against the Kubernetes API emulator: the
emulator's fixtures come from tests/kube/conftest.py, and pytest-jupyter's (jp_serverapp,
jp_fetch, jp_ws_fetch, its event loop and cleanup, all autouse where it says so) from here,
for this directory only: they must not reach the controller's tests beside it."""

import os
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
from pytest_jupyter.jupyter_server import *

from tests.kube.jobs_fixtures import IMAGE, REPO


@pytest.fixture
def mlc(jp_serverapp, jp_asyncio_loop):
    """The running MLClusterApp (its start hook run, as `jupyter server` would)."""
    app = jp_serverapp.extension_manager.extension_points["mlcluster"].app
    jp_asyncio_loop.run_until_complete(app._start_jupyter_server_extension(jp_serverapp))
    return app


@pytest.fixture
def run(jp_asyncio_loop) -> Callable[[Coroutine[Any, Any, Any]], Any]:
    """Run a scenario on the server's event loop (these tests are plain functions, so the
    controller's context manager can wrap them)."""
    return jp_asyncio_loop.run_until_complete


def per_user_server_config(
    monkeypatch: pytest.MonkeyPatch, template: str, shared_namespace: str
) -> dict[str, Any]:
    """jp_server_config of a shared server that maps users to namespaces (`template`) and
    trusts the identity header; its Kubernetes jobs' supervisors are processes of their own
    that import this checkout's code. `shared_namespace`: where a server without per-user
    namespaces would put jobs (none of a user with a namespace of their own may land there)."""
    monkeypatch.setenv("MLCLUSTER_WARM_POOL", "0")
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    )
    return {
        "ServerApp": {"jpserver_extensions": {"jupyterlab_mlcluster": True}},
        "MLClusterApp": {
            "trust_identity_header": True,
            "user_namespace_template": template,
            "schedule_interval": 0,
            "metrics_interval": 0,
        },
        "MLClusterConfig": {
            "kubernetes_namespace": shared_namespace,
            "kubernetes_image": IMAGE,
            "warm_pool": False,
        },
        # One login cookie name for the REST client (127.0.0.1) and the websocket (localhost).
        "IdentityProvider": {"cookie_name": "mlcluster-test-user"},
    }
