"""A real IPython kernel (jupyter_client) per test, sharing the test's job store."""

from __future__ import annotations

import os

import pytest
from helpers import start_kernel
from kernel_session import KernelSession


@pytest.fixture
def kernel(store_dir):
    km, kc = start_kernel(kernel_name="python3", env=dict(os.environ))
    session = KernelSession(km, kc)
    try:
        yield session
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
