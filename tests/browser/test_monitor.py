"""The %%distributed live monitor in a real JupyterLab page (headless chromium)."""

from __future__ import annotations

import json

import pytest

from .lab import DOCS_IMG, box_union, browser_page, notebook_json, running_lab, save_docs_image

CELL = """%%distributed --workers 4 --name monitor-demo
import os, time, jupyterlab_mlcluster as mlc
from tqdm import tqdm
rank = int(os.environ["RANK"])
for step in tqdm(range(40), desc="train"):
    time.sleep(0.1 + 0.03 * rank)
    if step % 10 == 0:
        print(f"step {step}: loss {1 / (step + 1):.3f}")
for i in range(1, 6):
    mlc.progress(i, 5, desc="eval")
    time.sleep(0.2)
rank
"""

# Over before the widgets are due: it leaves the plain HTML summary.
QUICK_CELL = (
    "%%distributed --workers 2 --name quick\nprint('hello from', __import__('os').environ['RANK'])"
)


@pytest.fixture
def notebook_lab(tmp_path, lab_env, store_dir):
    root = tmp_path / "root"
    root.mkdir()
    (root / "monitor.ipynb").write_text(json.dumps(notebook_json([CELL, QUICK_CELL])))
    with running_lab(root, env=lab_env) as lab:
        yield lab


def test_monitor_renders_live_and_final(notebook_lab, artifacts, service):
    lab = notebook_lab
    with browser_page(width=1280, height=900) as page:
        page.goto(f"{lab.url}lab/tree/monitor.ipynb?reset&token={lab.token}", timeout=60_000)
        page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=60_000)
        # the kernel is up when the status bar says so
        page.wait_for_selector(".jp-StatusBar-Widget:has-text('| Idle')", timeout=60_000)
        page.locator(".jp-Cell .jp-InputArea-editor").first.click()
        page.keyboard.press("Shift+Enter")
        monitor = page.locator(".mlcluster-monitor")
        monitor.wait_for(timeout=60_000)
        page.wait_for_selector(
            ".mlcluster-monitor tr.mlc-rank[data-state='running']", timeout=60_000
        )
        page.wait_for_selector(".mlcluster-monitor .mlc-state-running", timeout=30_000)
        page.wait_for_timeout(3000 if DOCS_IMG else 1500)  # some progress and output
        monitor.screenshot(path=str(artifacts / "monitor-running.png"))
        page.screenshot(path=str(artifacts / "monitor-running-page.png"))
        # The README's picture: the cell and its live monitor.
        cell_input = page.locator(".jp-Notebook .jp-Cell .jp-InputArea").first
        save_docs_image(page, "monitor.png", artifacts, clip=box_union(cell_input, monitor, pad=2))
        page.wait_for_selector(".mlcluster-monitor .mlc-state-succeeded", timeout=120_000)
        page.wait_for_function(
            "document.querySelectorAll(\".mlcluster-monitor tr.mlc-rank[data-state='succeeded']\").length === 4",
            timeout=60_000,
        )
        page.wait_for_selector(
            ".jp-Cell .jp-OutputArea-output:has-text('[rank 3] step 30')", timeout=30_000
        )
        page.set_viewport_size({"width": 1280, "height": 1800})  # the whole cell, outputs too
        page.wait_for_timeout(500)
        cell = page.locator(".jp-Notebook .jp-Cell").first
        cell.screenshot(path=str(artifacts / "monitor-final.png"))
        # the cell's value is rank 0's last expression
        assert page.locator(".jp-OutputArea-executeResult").first.inner_text().strip().endswith("0")
        # the Cancel button goes once the job is over
        assert page.locator(".mlcluster-monitor button:has-text('Cancel')").is_hidden()
        # the rank tabs hold the logs
        page.locator(".mlcluster-monitor .lm-TabBar-tab:has-text('rank 2')").click()
        page.wait_for_selector(
            ".mlcluster-monitor pre:visible:has-text('step 30: loss')", timeout=10_000
        )
        # A quick job: over before its widgets are due (WIDGET_DELAY), it leaves the plain
        # summary, readable without widgets (and in a saved notebook). On a loaded machine
        # even two ranks may outlast the delay: then the live monitor shows, and its end
        # must be as complete.
        quick = page.locator(".jp-Notebook .jp-Cell").nth(1)
        quick.locator(".jp-InputArea-editor").click()
        page.keyboard.press("Shift+Enter")
        quick.locator(
            ".mlcluster-summary tr.mlc-rank[data-state='succeeded'], "
            ".mlcluster-monitor .mlc-state-succeeded"
        ).first.wait_for(timeout=60_000)
        view = quick.locator(".mlcluster-summary, .mlcluster-monitor").first
        page.wait_for_function(
            "cell => cell.querySelectorAll(\"tr.mlc-rank[data-state='succeeded']\").length === 2",
            arg=quick.element_handle(),
            timeout=60_000,
        )
        assert "quick" in view.inner_text() and "succeeded" in view.inner_text()
        page.locator(".jp-Notebook .jp-Cell").nth(1).screenshot(
            path=str(artifacts / "monitor-quick.png")
        )
        # nothing went wrong in the page but the notebook servers route's deliberate 503
        errors = [e for e in page.console_errors if "503 (Service Unavailable)" not in e]
        assert not errors, errors
    record = next(r for r in service.store.list_jobs()[0] if r.name == "monitor-demo")
    assert record.state == "succeeded"
    assert record.origin.get("notebook", "").endswith("monitor.ipynb")  # the server told the kernel
