"""The server extension's notebook-server API against the Kubernetes API emulator: the
emulator's fixtures come from tests/kube/conftest.py, and pytest-jupyter's (jp_serverapp,
jp_fetch, jp_ws_fetch, its event loop and cleanup, all autouse where it says so) from here,
for this directory only: they must not reach the controller's tests beside it."""

from pytest_jupyter.jupyter_server import *
