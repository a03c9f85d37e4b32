"""The server extension's notebook-server API against the Kubernetes API emulator: the
emulator's fixtures come from tests/kube/conftest.py, and pytest-jupyter's (jp_serverapp,
jp_fetch, jp_ws_fetch, its event loop and cleanup, all autouse where it says so) from here,
for this directory only: they must not reach the controller's tests beside it."""

from collections.abc import Callable, Coroutine
from typing import Any

import pytest
from pytest_jupyter.jupyter_server import *


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
