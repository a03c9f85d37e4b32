"""Curves of `mlc.log` in a real JupyterLab and chromium (issue 35, item 2): a real job of 4
ranks logs 10,000 steps each; the cell monitor draws them live, then the sidebar's job
detail draws the same series; both stay legible in the dark theme. Screenshots: the
artifacts, and docs/img with MLCLUSTER_DOCS_IMG (scripts/screenshots.sh)."""

from __future__ import annotations

import json

import pytest

from jupyterlab_mlcluster.kernel import curves

from .lab import (
    DARK_THEME,
    LIGHT_THEME,
    SIDEBAR,
    box_union,
    browser_page,
    notebook_json,
    open_notebook,
    open_sidebar,
    run_cell,
    running_lab,
    save_docs_image,
    set_theme,
)

STEPS = 10_000
# A pause every 50 steps keeps each batch of mlc.log (sent every 0.5 s) under the report
# channel's 64 KiB record (protocol.py), whatever the machine's speed.
CELL = f"""%%distributed --workers 4 --name curves-demo
import math, os, random, time, jupyterlab_mlcluster as mlc
rank = int(os.environ["RANK"])
random.seed(rank)
for step in range({STEPS}):
    warm = min(1.0, step / 800)
    loss = (2.2 * math.exp(-step / 2200) + 0.15 + 0.03 * rank
            + 0.12 * random.random() * (1.2 - warm * 0.8))
    lr = 3e-4 * warm * 0.5 * (1 + math.cos(math.pi * step / {STEPS}))
    mlc.log(step, loss=round(loss, 4), lr=float(f"{{lr:.3g}}"))
    if step % 50 == 49:
        time.sleep(0.04)
time.sleep(1)
"""


@pytest.fixture
def curves_lab(tmp_path, lab_env, store_dir):
    root = tmp_path / "root"
    root.mkdir()
    (root / "curves.ipynb").write_text(json.dumps(notebook_json([CELL])))
    with running_lab(root, env=lab_env) as lab:
        yield lab


def drawn_points(page, scope: str) -> list[int]:
    return page.eval_on_selector_all(
        f"{scope} svg[data-series='loss'] polyline.jp-mlc-curve-line, "
        f"{scope} svg[data-series='loss'] polyline.mlc-curve-line",
        "els => els.map(e => e.getAttribute('points').trim().split(/\\s+/).length)",
    )


def test_curves_in_the_cell_and_the_sidebar(curves_lab, artifacts, service):
    lab = curves_lab
    with browser_page(width=1280, height=1000) as page:
        open_notebook(page, lab, "curves.ipynb")
        # every count of points the monitor's loss chart showed, as the page saw it
        page.evaluate(
            """() => { window.kept = [];
            new MutationObserver(() => {
              const svg = document.querySelector(".mlcluster-monitor svg[data-series='loss']");
              if (svg) window.kept.push(Number(svg.dataset.kept));
            }).observe(document.body, {childList: true, subtree: true}); }"""
        )
        run_cell(page, 0)
        page.wait_for_selector(
            ".mlcluster-monitor svg.mlc-curve[data-series='loss']", timeout=90_000
        )
        page.wait_for_selector(".mlcluster-monitor .mlc-state-succeeded", timeout=120_000)
        # the last redraw has every point: 4 ranks x 10,000, drawn downsampled
        page.wait_for_selector(
            f".mlcluster-monitor svg.mlc-curve[data-series='loss'][data-kept='{4 * STEPS}']",
            timeout=30_000,
        )
        # live: drawn while the job ran, more points each time
        kept = page.evaluate("window.kept")
        assert any(0 < n < 4 * STEPS for n in kept), kept
        assert kept == sorted(kept), kept
        counts = drawn_points(page, ".mlcluster-monitor")
        assert len(counts) == 4 and all(
            curves.PLOT_WIDTH <= n <= 2 * curves.PLOT_WIDTH for n in counts
        ), counts
        assert page.locator(".mlcluster-monitor svg.mlc-curve[data-series='lr']").count() == 1
        panel = page.locator(".mlcluster-monitor .mlc-curves-panel")
        monitor = page.locator(".mlcluster-monitor")
        save_docs_image(page, "monitor-curves.png", artifacts, clip=box_union(monitor, pad=2))
        # the toggle: the ranks' mean with its min–max band (the kernel redraws)
        panel.locator("button:has-text('mean ± range')").click()
        page.wait_for_selector(".mlcluster-monitor .mlc-curves[data-mode='mean']")
        assert page.locator(".mlcluster-monitor polygon.mlc-curve-band").count() == 2
        set_theme(page, DARK_THEME)
        save_docs_image(page, "monitor-curves-dark.png", artifacts, clip=box_union(panel, pad=4))
        panel.locator("button:has-text('per rank')").click()
        page.wait_for_selector(".mlcluster-monitor .mlc-curves[data-mode='ranks']")
        page.screenshot(path=str(artifacts / "monitor-curves-page-dark.png"))

        # the sidebar's job detail: the same series, from GET /jobs/{id}/metrics
        open_sidebar(page)
        page.locator(f"{SIDEBAR} .jp-mlc-job-row:has-text('curves-demo')").first.click()
        page.wait_for_selector(
            f"{SIDEBAR} svg.jp-mlc-curve[data-series='loss'][data-kept='{4 * STEPS}']",
            timeout=30_000,
        )
        counts = drawn_points(page, SIDEBAR)
        # as wide as the panel, one drawing unit a pixel: two points per plot column at most
        width = int(page.get_attribute(f"{SIDEBAR} svg.jp-mlc-curve[data-series='loss']", "width"))
        assert 200 <= width <= 420, width
        assert len(counts) == 4 and all(0 < n <= 2 * (width - 52) for n in counts), counts
        charts = page.locator(f"{SIDEBAR} .jp-mlc-curves")
        charts.scroll_into_view_if_needed()
        save_docs_image(page, "sidebar-curves-dark.png", artifacts, locator=charts)
        page.locator(f"{SIDEBAR} .jp-mlc-curves-mode button:has-text('mean ± range')").click()
        page.wait_for_selector(f"{SIDEBAR} .jp-mlc-curves[data-mode='mean']")
        assert page.locator(f"{SIDEBAR} polygon.jp-mlc-curve-band").count() == 2
        page.locator(f"{SIDEBAR} .jp-mlc-curves-mode button:has-text('auto')").click()
        set_theme(page, LIGHT_THEME)
        charts.scroll_into_view_if_needed()
        save_docs_image(page, "sidebar-curves.png", artifacts, locator=charts)
        # axis text reads against the panel in both themes (not the same colour)
        tick = page.locator(f"{SIDEBAR} .jp-mlc-curve-tick").first
        assert tick.evaluate("e => getComputedStyle(e).fill") != "rgb(255, 255, 255)"
        errors = [e for e in page.console_errors if "503 (Service Unavailable)" not in e]
        assert not errors, errors
    record = next(r for r in service.store.list_jobs()[0] if r.name == "curves-demo")
    assert record.state == "succeeded"
