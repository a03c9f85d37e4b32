"""The sidebar against whatever this JupyterLab really serves at /mlcluster/api (no canned answers)."""

from __future__ import annotations

from .lab import SIDEBAR, open_sidebar


def test_panel_reports_the_servers_real_state(lab, lab_page, artifacts):
    page = lab_page
    panel = open_sidebar(page)
    assert panel.locator(".jp-mlc-title").inner_text().lower() == "distributed jobs"
    status, _ = lab.api("mlcluster/api/cluster")
    if status == 404:
        # server extension not installed/enabled here: the panel says so, plainly
        banner = page.locator(f'{SIDEBAR} .jp-mlc-banner-error:has-text("server extension is not answering")')
        banner.wait_for(timeout=15_000)
        page.screenshot(path=artifacts / "sidebar-no-server-extension.png")
    else:
        assert status == 200, status
        page.wait_for_selector(f"{SIDEBAR} .jp-mlc-connection-live", timeout=15_000)
        page.screenshot(path=artifacts / "sidebar-real-server.png")
