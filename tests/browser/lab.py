"""Helpers for browser tests: a real `jupyter lab` server and a headless chromium page on it.

Reusable from any test or script:

    with running_lab(root_dir) as lab, browser_page() as page:
        open_lab(page, lab.url)
        open_sidebar(page)
        page.screenshot(path="artifacts/panel.png")

Chromium is Debian's (`/usr/bin/chromium`; `playwright install` cannot download browsers
here). Override with MLCLUSTER_CHROMIUM.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tests.helpers import free_port

if TYPE_CHECKING:
    from playwright.sync_api import Page

CHROMIUM = os.environ.get("MLCLUSTER_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
#: Screenshots of every run (CI keeps them); MLCLUSTER_ARTIFACTS moves them.
ARTIFACTS = (
    Path(os.environ.get("MLCLUSTER_ARTIFACTS", Path(__file__).resolve().parents[2] / "artifacts"))
    / "browser"
)
SIDEBAR_ID = "jupyterlab-mlcluster-sidebar"
SIDEBAR = f"#{SIDEBAR_ID}"
LIGHT_THEME = "JupyterLab Light"
DARK_THEME = "JupyterLab Dark"


# Never through an HTTP proxy from the environment: the server is on localhost.
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@dataclass
class Lab:
    url: str  # base URL with trailing slash, e.g. http://127.0.0.1:8899/
    token: str
    root_dir: Path
    process: subprocess.Popen
    log_path: Path

    @property
    def lab_url(self) -> str:
        """Opening this logs the browser in (the token becomes a cookie) and starts from an
        empty layout (`reset`), whatever an earlier page of the same server left open."""
        return f"{self.url}lab?reset&token={self.token}"

    @property
    def port(self) -> int:
        return int(self.url.rstrip("/").rsplit(":", 1)[1])

    def api(self, path: str, method: str = "GET", body: object = None) -> tuple[int, bytes]:
        """A plain authenticated request to the server (status, body), no exceptions; `body`
        is sent as JSON."""
        headers = {"Authorization": f"token {self.token}"}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        req = urllib.request.Request(
            self.url + path.lstrip("/"), data=data, method=method, headers=headers
        )
        try:
            # Generous: a fresh server's first submit imports and opens what it needs, and a
            # CI machine at load 15 took more than 10 s for it.
            with _DIRECT.open(req, timeout=60) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()
        except (urllib.error.URLError, ConnectionError):
            return 0, b""  # not listening (yet, or any more)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


@contextlib.contextmanager
def running_lab(
    root_dir: str | os.PathLike[str],
    *,
    env: dict[str, str] | None = None,
    extra_args: list[str] | None = None,
    timeout: float = 60.0,
    port: int | None = None,
    token: str | None = None,
) -> Iterator[Lab]:
    """Start `jupyter lab` on 127.0.0.1 (own process group), wait until it answers, stop it
    (and everything it started, e.g. kernels) afterwards. The server log goes to
    `<root_dir>/.jupyter-lab.log` (appended: a restarted server keeps the earlier story).

    `port` and `token` start it where an earlier server was, so that a page left open on the
    old one can reconnect (its login cookie stays valid when JUPYTER_RUNTIME_DIR, which holds
    the cookie secret, is the same)."""
    root = Path(root_dir).resolve()
    root.mkdir(parents=True, exist_ok=True)
    port, token = port or free_port(), token or secrets.token_hex(16)
    log_path = root / ".jupyter-lab.log"
    # Own settings and workspaces: a test's theme switch must not leak into the user's lab,
    # and the "get notified about Jupyter news?" toast must not cover the screenshots.
    settings_dir = root / ".lab-settings"
    news = settings_dir / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings"
    news.parent.mkdir(parents=True, exist_ok=True)
    news.write_text('{"fetchNews": "false"}')
    lab_env = {
        # No cluster unless a test names one: a $KUBECONFIG that an earlier test in this
        # process pointed at its (since stopped) emulator must not leak into the server.
        "KUBECONFIG": str(root / ".no-kubeconfig"),
        "JUPYTERLAB_SETTINGS_DIR": str(settings_dir),
        "JUPYTERLAB_WORKSPACES_DIR": str(root / ".lab-workspaces"),
        **(env or {}),
    }
    cmd = [
        sys.executable, "-m", "jupyterlab",
        "--no-browser", "--allow-root",
        "--ip=127.0.0.1", f"--port={port}",
        f"--ServerApp.token={token}",
        f"--ServerApp.root_dir={root}",
        "--LabApp.news_url=None",
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
        *(extra_args or []),
    ]  # fmt: skip
    with open(log_path, "ab") as log:
        process = subprocess.Popen(
            cmd,
            cwd=root,
            env={**os.environ, **lab_env},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    lab = Lab(f"http://127.0.0.1:{port}/", token, root, process, log_path)
    try:
        deadline = time.monotonic() + timeout
        while lab.api("api/status")[0] != 200:
            if process.poll() is not None:
                raise RuntimeError(f"jupyter lab exited with {process.returncode}:\n{lab.log()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"jupyter lab did not answer within {timeout}s:\n{lab.log()}")
            time.sleep(0.2)
        yield lab
    finally:
        stop_process_group(process)


def stop_process_group(process: subprocess.Popen, grace: float = 10.0) -> None:
    """SIGTERM the group (the server shuts its kernels down), SIGKILL what is left."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(grace)
        except subprocess.TimeoutExpired:
            pass
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


@contextlib.contextmanager
def browser_page(
    *, width: int = 1400, height: int = 900, color_scheme: str = "light"
) -> Iterator[Page]:
    """A fresh headless chromium page; browser console errors are kept on `page.console_errors`,
    answers of status 400 and over on `page.failed_responses` ('404 GET <url>')."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            context = browser.new_context(
                viewport={"width": width, "height": height}, color_scheme=color_scheme
            )
            page = context.new_page()
            page.console_errors = []  # type: ignore[attr-defined]
            page.on(
                "console",
                lambda msg: msg.type == "error" and page.console_errors.append(msg.text),  # type: ignore[attr-defined]
            )
            # The console's "Failed to load resource" names no URL: the failing answer does.
            page.failed_responses = []  # type: ignore[attr-defined]
            page.on(
                "response",
                lambda response: (
                    response.status >= 400
                    and page.failed_responses.append(  # type: ignore[attr-defined]
                        f"{response.status} {response.request.method} {response.url}"
                    )
                ),
            )
            yield page
        finally:
            browser.close()


def open_lab(page, lab: Lab, timeout: float = 60_000) -> None:
    """Load JupyterLab and wait until its shell is up and the launcher or a document shows."""
    page.goto(lab.lab_url, timeout=timeout)
    wait_for_lab(page, timeout)


def wait_for_lab(page, timeout: float = 60_000) -> None:
    """After a (re)load: JupyterLab removes its splash once the layout is restored."""
    page.wait_for_selector("#jupyterlab-splash", state="detached", timeout=timeout)
    page.wait_for_selector("#jp-main-dock-panel", state="visible", timeout=timeout)
    page.wait_for_selector(".jp-SideBar.jp-mod-left", state="visible", timeout=timeout)
    # Plugins activate after the shell appears; wait for ours to add its tab.
    page.wait_for_selector(sidebar_tab_selector(), timeout=timeout)


def sidebar_tab_selector() -> str:
    return f'.jp-SideBar.jp-mod-left li[data-id="{SIDEBAR_ID}"]'


def open_sidebar(page, timeout: float = 30_000):
    """Show the Distributed jobs panel (click its tab unless it is already open: the restored
    layout may have it open, and clicking the current tab would collapse it)."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    panel = page.locator(SIDEBAR)
    tab = page.locator(sidebar_tab_selector())
    tab.wait_for(timeout=timeout)
    for _ in range(2):
        if panel.is_visible():
            break
        tab.click()
        try:
            panel.wait_for(state="visible", timeout=3_000)
        except PlaywrightTimeout:  # a restore raced the click and collapsed it again: once more
            pass
    panel.wait_for(state="visible", timeout=timeout)
    return panel


def run_palette_command(page, label: str) -> None:
    """Run a command as a user does: open the command palette, type its label, press Enter."""
    page.keyboard.press("Control+Shift+C")
    palette = page.locator("#command-palette .lm-CommandPalette-input")
    palette.wait_for(state="visible")
    palette.fill(label)
    page.locator(f'#command-palette .lm-CommandPalette-item:has-text("{label}")').first.wait_for()
    page.keyboard.press("Enter")


def set_theme(page, theme: str) -> None:
    """Switch JupyterLab's theme via the Settings menu, and wait until it applies."""
    page.click('.lm-MenuBar-itemLabel:text-is("Settings")')
    page.click('.lm-Menu-itemLabel:text-is("Theme")')
    page.click(f'.lm-Menu-itemLabel:text-is("{theme}")')
    light = "true" if theme == LIGHT_THEME else "false"
    page.wait_for_selector(f'body[data-jp-theme-light="{light}"]', state="attached", timeout=30_000)
    page.wait_for_timeout(300)  # the new theme's CSS variables settle


# -- notebooks ------------------------------------------------------------------------------


def notebook_json(cells: list[str]) -> dict:
    """An nbformat 4 notebook of code cells, for a Python 3 kernel."""
    return {
        "cells": [
            {
                "cell_type": "code",
                "metadata": {},
                "source": c,
                "outputs": [],
                "execution_count": None,
            }
            for c in cells
        ],
        "metadata": {
            "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}
        },
        "nbformat": 4,
        "nbformat_minor": 5,
    }


def open_notebook(page, lab: Lab, path: str, timeout: float = 60_000) -> None:
    """Load JupyterLab with only this notebook open and wait until its kernel is idle."""
    page.goto(f"{lab.url}lab/tree/{path}?reset&token={lab.token}", timeout=timeout)
    wait_for_lab(page, timeout)
    page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=timeout)
    wait_for_kernel_idle(page, timeout)


def wait_for_kernel_idle(page, timeout: float = 60_000) -> None:
    page.wait_for_selector(".jp-StatusBar-Widget:has-text('| Idle')", timeout=timeout)


def notebook_cell(page, index: int):
    return page.locator(".jp-NotebookPanel:visible .jp-Notebook .jp-Cell").nth(index)


def run_cell(page, index: int) -> None:
    """Run one cell as a user does: click into its editor, press Shift+Enter."""
    notebook_cell(page, index).locator(".jp-InputArea-editor").click()
    page.keyboard.press("Shift+Enter")


# -- screenshots ------------------------------------------------------------------------------

#: Set by scripts/screenshots.sh: the README's images are written there (docs/img).
DOCS_IMG = os.environ.get("MLCLUSTER_DOCS_IMG")


def save_docs_image(
    page, name: str, artifacts: Path, clip: dict | None = None, locator=None
) -> None:
    """Save a screenshot to the artifacts, and to the README's images when asked
    (MLCLUSTER_DOCS_IMG); `clip` (page coordinates) or `locator` crops it."""
    targets = [artifacts / name]
    if DOCS_IMG:
        Path(DOCS_IMG).mkdir(parents=True, exist_ok=True)
        targets.append(Path(DOCS_IMG) / name)
    for target in targets:
        if locator is not None:
            locator.screenshot(path=str(target))
        else:
            page.screenshot(path=str(target), clip=clip)


def save_failure_screenshot(test_name: str, page) -> None:
    """A picture of a failed test's page (called by the report hook in conftest.py)."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(Exception):  # the page may have gone with the failure
        page.screenshot(path=str(ARTIFACTS / f"FAILED-{test_name}.png"))


def box_union(*locators, pad: int = 0, max_width: int | None = None) -> dict:
    """The page rectangle around these elements (for `save_docs_image(clip=...)`)."""
    boxes = [loc.bounding_box() for loc in locators]
    x0 = max(0, min(b["x"] for b in boxes) - pad)
    y0 = max(0, min(b["y"] for b in boxes) - pad)
    x1 = max(b["x"] + b["width"] for b in boxes) + pad
    y1 = max(b["y"] + b["height"] for b in boxes) + pad
    width = x1 - x0 if max_width is None else min(x1 - x0, max_width)
    return {"x": x0, "y": y0, "width": width, "height": y1 - y0}
