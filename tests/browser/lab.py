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
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

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
SIDEBAR_ID = "jupyterlab-mlcluster-sidebar"
SIDEBAR = f"#{SIDEBAR_ID}"
LIGHT_THEME = "JupyterLab Light"
DARK_THEME = "JupyterLab Dark"


# Never through an HTTP proxy from the environment: the server is on localhost.
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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

    def api(self, path: str, method: str = "GET") -> tuple[int, bytes]:
        """A plain authenticated request to the server (status, body), no exceptions."""
        req = urllib.request.Request(
            self.url + path.lstrip("/"), method=method, headers={"Authorization": f"token {self.token}"}
        )
        try:
            with _DIRECT.open(req, timeout=10) as resp:
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
) -> Iterator[Lab]:
    """Start `jupyter lab` on 127.0.0.1 (own process group), wait until it answers, stop it
    (and everything it started, e.g. kernels) afterwards. The server log goes to
    `<root_dir>/.jupyter-lab.log`."""
    root = Path(root_dir).resolve()
    root.mkdir(parents=True, exist_ok=True)
    port, token = free_port(), secrets.token_hex(16)
    log_path = root / ".jupyter-lab.log"
    # Own settings and workspaces: a test's theme switch must not leak into the user's lab,
    # and the "get notified about Jupyter news?" toast must not cover the screenshots.
    settings_dir = root / ".lab-settings"
    news = settings_dir / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings"
    news.parent.mkdir(parents=True, exist_ok=True)
    news.write_text('{"fetchNews": "false"}')
    lab_env = {
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
    with open(log_path, "wb") as log:
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
) -> Iterator["playwright.sync_api.Page"]:  # noqa: F821
    """A fresh headless chromium page; browser console errors are kept on `page.console_errors`."""
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
    panel = page.locator(SIDEBAR)
    tab = page.locator(sidebar_tab_selector())
    tab.wait_for(timeout=timeout)
    for _ in range(2):
        if panel.is_visible():
            break
        tab.click()
        try:
            panel.wait_for(state="visible", timeout=3_000)
        except Exception:  # a restore raced the click and collapsed it again: once more
            continue
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
    page.wait_for_selector(
        f'body[data-jp-theme-light="{light}"]', state="attached", timeout=30_000
    )
    page.wait_for_timeout(300)  # the new theme's CSS variables settle
