"""Fixtures for browser tests: one real `jupyter lab` per module, a fresh chromium page per test."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from .lab import ARTIFACTS, CHROMIUM, browser_page, open_lab, running_lab, save_failure_screenshot

REPO = Path(__file__).resolve().parents[2]
BUILT = REPO / "labextension"


def pytest_collection_modifyitems(items):
    for item in items:
        if "tests/browser/" in str(item.fspath).replace(os.sep, "/"):
            item.add_marker(pytest.mark.browser)


@pytest.fixture(scope="session")
def labextension_path(tmp_path_factory) -> Path:
    """A JUPYTER_PATH entry holding this checkout's built sidebar, whatever else is installed."""
    if not shutil.which(CHROMIUM) and not Path(CHROMIUM).exists():
        # A failure, not a skip: the sidebar's main path is only tested here.
        pytest.fail(
            f"no chromium at {CHROMIUM} (apt-get install chromium, or set MLCLUSTER_CHROMIUM)"
        )
    if not (BUILT / "package.json").exists():
        pytest.fail("labextension/ is not built: run `jlpm install && jlpm build` first")
    path = tmp_path_factory.mktemp("jupyter-path")
    (path / "labextensions").mkdir()
    (path / "labextensions" / "jupyterlab-mlcluster").symlink_to(BUILT)
    return path


@pytest.fixture(scope="session")
def lab_env(labextension_path) -> dict[str, str]:
    """Environment of the labs the tests start: this checkout's sidebar and Python package
    (server extension, kernels' magics, job supervisors), whatever is installed."""
    return {
        "JUPYTER_PATH": str(labextension_path),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }


@pytest.fixture(scope="module")
def lab(tmp_path_factory, lab_env):
    root = tmp_path_factory.mktemp("lab-root")
    with running_lab(root, env=lab_env) as server:
        yield server


@pytest.fixture
def page(lab, request):
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


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    """A failed browser test leaves a picture of its page (whichever fixture holds the page:
    per test, shared by a module, or loaded with JupyterLab), taken while it is still open."""
    report = yield
    if report.when == "call" and report.failed:
        pages = [value for value in item.funcargs.values() if hasattr(value, "screenshot")]
        if pages:
            save_failure_screenshot(item.name, pages[0])
    return report
