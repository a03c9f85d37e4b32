"""TensorBoard and idle GPUs in a real lab: a `%%distributed` cell whose 2 ranks write scalars
with torch's SummaryWriter, then hold their (test NVML) GPUs idle. The cell monitor and the
sidebar flag the idle GPUs; the monitor's TensorBoard button and the sidebar's open the job's
curve in a lab tab through the server's proxy."""

from __future__ import annotations

import json

import pytest

from jupyterlab_mlcluster.runtime import nvml

from .lab import (
    SIDEBAR,
    box_union,
    browser_page,
    notebook_cell,
    notebook_json,
    open_notebook,
    open_sidebar,
    run_cell,
    running_lab,
    save_docs_image,
)

pytest.importorskip("tensorboard", reason="tensorboard is in the test extra")

# A second job to compare with: one rank, a flatter curve.
BASELINE = """
import os
from torch.utils.tensorboard import SummaryWriter
with SummaryWriter(os.environ["MLCLUSTER_TENSORBOARD_DIR"]) as writer:
    for step in range(200):
        writer.add_scalar("train/loss", 1.5 - step / 400, step)
"""

CELL = """%%distributed --workers 2 --gpus-per-worker 1 --name tb-curve
import math, os, time
from torch.utils.tensorboard import SummaryWriter

rank = int(os.environ["RANK"])
writer = SummaryWriter(os.path.join(os.environ["MLCLUSTER_TENSORBOARD_DIR"], f"rank{rank}"))
for step in range(200):
    writer.add_scalar("train/loss", 2.3 * math.exp(-step / 50) + 0.05 * rank, step)
writer.close()
while not os.path.exists("release"):  # hold the (idle) GPUs until the test is done
    time.sleep(0.1)
"""


@pytest.fixture(scope="module")
def lab(tmp_path_factory, lab_env):
    base = tmp_path_factory.mktemp("tb")
    config_dir = base / "jupyter-config"
    config_dir.mkdir()
    # Two GPUs in the local pool, their utilisation from the test NVML file (no GPU here),
    # and a job flagged once its GPUs idle for 1 s: kernels and the server read this file.
    (config_dir / "jupyter_mlcluster_config.json").write_text(
        json.dumps({"MLClusterConfig": {"gpus": "0,1", "idle_gpu_after": 1.0}})
    )
    gpus = base / "gpus.json"
    gpus.write_text(json.dumps({"0": 1, "1": 2}))
    root = base / "root"
    root.mkdir()
    (root / "tensorboard.ipynb").write_text(json.dumps(notebook_json([CELL])))
    env = {
        **lab_env,
        "MLCLUSTER_STORE_DIR": str(base / "store"),
        "MLCLUSTER_CPU_SLOTS": "4",
        nvml.TEST_FILE_ENV: str(gpus),
        "JUPYTER_CONFIG_DIR": str(config_dir),
        "JUPYTER_RUNTIME_DIR": str(base / "runtime"),
    }
    with running_lab(root, env=env) as running:
        running.release = root / "release"  # beside the notebook: the ranks' directory
        yield running


def api(lab, path: str, method: str = "GET", body=None):
    status, data = lab.api(f"mlcluster/api/{path}", method, body)
    return status, (json.loads(data) if data else None)


def wait_for_curve(page, settle_ms: int = 1_000) -> None:
    """The TensorBoard tab is in front and shows the job's scalar card."""
    page.locator(".jp-mlc-tensorboard").wait_for(timeout=120_000)
    frame = page.frame_locator(".jp-mlc-tensorboard:visible iframe")
    frame.get_by_text("train/loss").first.wait_for(timeout=120_000)
    # The curve itself: TensorBoard draws each scalar card into a canvas or svg.
    frame.locator("tb-scalar-card, scalar-card").first.wait_for(timeout=60_000)
    page.wait_for_timeout(settle_ms)  # let the line chart finish drawing
    tab = page.get_by_role("tab", name="TensorBoard: tb-curve")
    assert tab.get_attribute("aria-selected") == "true"


def test_monitor_and_sidebar_flag_idle_gpus_and_open_tensorboard(lab, artifacts):
    status, baseline = api(lab, "jobs", "POST", {"name": "tb-baseline", "code": BASELINE})
    assert status == 201, baseline
    with browser_page(width=1280, height=860) as page:
        open_notebook(page, lab, "tensorboard.ipynb")
        run_cell(page, 0)
        monitor = page.locator(".mlcluster-monitor")
        # The ranks wrote their scalars and hold GPUs at 1-2 %: flagged after 1 s.
        flag = monitor.locator(".mlc-idle-gpus")
        flag.wait_for(timeout=120_000)
        assert "GPUs idle since" in flag.inner_text()
        page.wait_for_timeout(500)
        cell_input = notebook_cell(page, 0).locator(".jp-InputArea")
        save_docs_image(
            page, "monitor-idle-gpus.png", artifacts, clip=box_union(cell_input, monitor, pad=2)
        )

        # The monitor's TensorBoard button: the lab extension opens the job's tab.
        monitor.locator("[data-mlcluster-tensorboard]").click()
        wait_for_curve(page)
        page.screenshot(path=str(artifacts / "tensorboard-from-monitor.png"))
        page.get_by_role("tab", name="TensorBoard: tb-curve").locator(
            ".lm-TabBar-tabCloseIcon"
        ).click()
        page.locator(".jp-mlc-tensorboard").wait_for(state="detached", timeout=10_000)

        # The sidebar flags the same job in its list and in its view.
        panel = open_sidebar(page)
        row = page.locator(f'{SIDEBAR} .jp-mlc-job-row:has(.jp-mlc-job-name:text-is("tb-curve"))')
        row.locator(".jp-mlc-idle-gpus").wait_for(timeout=30_000)
        assert "GPUs idle" in row.get_attribute("aria-label")
        panel.screenshot(path=str(artifacts / "sidebar-idle-gpus-list.png"))
        row.click()
        banner = panel.locator(".jp-mlc-banner-warn:has-text('Idle GPUs')")
        banner.wait_for(timeout=10_000)
        panel.screenshot(path=str(artifacts / "sidebar-idle-gpus-detail.png"))

        lab.release.touch()
        panel.locator(".jp-mlc-detail-head .jp-mlc-state-succeeded").wait_for(timeout=60_000)
        assert banner.count() == 0  # over: nothing held any more

        # The sidebar's TensorBoard button (the README's picture).
        panel.get_by_role("button", name="Open TensorBoard of job tb-curve").click()
        wait_for_curve(page, settle_ms=4_000)
        save_docs_image(page, "tensorboard.png", artifacts)

        # Compare: the job and the baseline in one TensorBoard, one run per job.
        _, done = api(lab, f"jobs/{baseline['id']}")
        assert done["state"] == "succeeded", done
        panel.get_by_role(
            "button", name="Compare job tb-curve with other jobs in TensorBoard"
        ).click()
        choices = page.locator(".jp-Dialog select")
        picked = [o for o in choices.locator("option").all_inner_texts() if "tb-" in o]
        assert len(picked) == 2, picked
        choices.select_option(label=picked)
        page.locator(".jp-Dialog .jp-mod-accept").click()
        compared = page.get_by_role("tab", name="TensorBoard: ")
        compared.filter(has_text="tb-baseline").filter(has_text="tb-curve").wait_for(timeout=30_000)
        frame = page.frame_locator(".jp-mlc-tensorboard:visible iframe")
        frame.get_by_text(baseline["id"]).first.wait_for(timeout=120_000)
        frame.get_by_text("train/loss").first.wait_for(timeout=60_000)
        page.mouse.move(0, 0)  # no hover card over the chart
        page.wait_for_timeout(1_000)  # the chart draws every run
        page.screenshot(path=str(artifacts / "tensorboard-compare.png"))
        # Nothing went wrong in the page but two known answers: the notebook servers route's
        # deliberate 503, and TensorBoard's own page asking for its Roboto fonts at the
        # server's root (absolute /font-roboto/ URLs in TensorBoard 2.20's index.html, which
        # --path_prefix does not rewrite: it falls back to other fonts), a 404 the lab log
        # shows; no other 404 may hide among them.
        errors = [e for e in page.console_errors if "503 (Service Unavailable)" not in e]
        not_found = [e for e in errors if "404 (Not Found)" in e]
        assert len(errors) == len(not_found), errors
        lost = [line for line in lab.log().splitlines() if " 404 GET " in line]
        assert all(" 404 GET /font-roboto/" in line for line in lost), lost
    _, jobs = api(lab, "jobs")
    (job,) = [j for j in jobs["jobs"] if j["name"] == "tb-curve"]
    assert job["state"] == "succeeded" and job["gpu_idle_since"] is None
