"""Fixtures for browser tests: one real `jupyter lab` per module, a fresh chromium page per test."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from .lab import CHROMIUM, browser_page, open_lab, running_lab

REPO = Path(__file__).resolve().parents[2]
BUILT = REPO / "labextension"
ARTIFACTS = Path(os.environ.get("MLCLUSTER_ARTIFACTS", REPO / "artifacts")) / "browser"


def pytest_collection_modifyitems(items):
    for item in items:
        if "tests/browser/" in str(item.fspath).replace(os.sep, "/"):
            item.add_marker(pytest.mark.browser)


@pytest.fixture(scope="session")
def labextension_path(tmp_path_factory) -> Path:
    """A JUPYTER_PATH entry holding this checkout's built sidebar, whatever else is installed."""
    if not shutil.which(CHROMIUM) and not Path(CHROMIUM).exists():
        # A failure, not a skip: the sidebar's main path is only tested here.
        pytest.fail(f"no chromium at {CHROMIUM} (apt-get install chromium, or set MLCLUSTER_CHROMIUM)")
    if not (BUILT / "package.json").exists():
        pytest.fail("labextension/ is not built: run `jlpm install && jlpm build` first")
    path = tmp_path_factory.mktemp("jupyter-path")
    (path / "labextensions").mkdir()
    (path / "labextensions" / "jupyterlab-mlcluster").symlink_to(BUILT)
    return path


@pytest.fixture(scope="module")
def lab(tmp_path_factory, labextension_path):
    root = tmp_path_factory.mktemp("lab-root")
    with running_lab(root, env={"JUPYTER_PATH": str(labextension_path)}) as server:
        yield server


@pytest.fixture
def page(lab):
    with browser_page(width=1280, height=860) as p:
        yield p


@pytest.fixture
def lab_page(lab, page):
    """A page with JupyterLab loaded."""
    open_lab(page, lab)
    return page


@pytest.fixture
def artifacts() -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    return ARTIFACTS
