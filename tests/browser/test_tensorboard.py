"""The sidebar's TensorBoard button: a real lab, a real 2-rank job writing scalars with
torch's SummaryWriter, and TensorBoard opened in a lab tab through the server's proxy."""

from __future__ import annotations

import json

import pytest
from helpers import wait_for

from .lab import SIDEBAR, browser_page, open_lab, open_sidebar, running_lab, save_docs_image

pytest.importorskip("tensorboard", reason="tensorboard is in the test extra")

CURVE = """
import math, os
import torch.distributed as dist
from torch.utils.tensorboard import SummaryWriter

dist.init_process_group("gloo")
rank = dist.get_rank()
writer = SummaryWriter(os.path.join(os.environ["MLCLUSTER_TENSORBOARD_DIR"], f"rank{rank}"))
for step in range(200):
    writer.add_scalar("train/loss", 2.3 * math.exp(-step / 50) + 0.05 * rank, step)
writer.close()
dist.barrier()
dist.destroy_process_group()
"""


@pytest.fixture(scope="module")
def lab(tmp_path_factory, lab_env):
    base = tmp_path_factory.mktemp("tb")
    env = {
        **lab_env,
        "MLCLUSTER_STORE_DIR": str(base / "store"),
        "MLCLUSTER_CPU_SLOTS": "4",
        "JUPYTER_CONFIG_DIR": str(base / "jupyter-config"),
        "JUPYTER_RUNTIME_DIR": str(base / "runtime"),
    }
    with running_lab(base / "root", env=env) as running:
        yield running


def api(lab, path: str, method: str = "GET", body=None):
    status, data = lab.api(f"mlcluster/api/{path}", method, body)
    return status, (json.loads(data) if data else None)


def test_the_sidebars_tensorboard_button_shows_the_jobs_curve(lab, artifacts):
    status, job = api(lab, "jobs", "POST", {"name": "tb-curve", "workers": 2, "code": CURVE})
    assert status == 201, job

    def finished():
        _, current = api(lab, f"jobs/{job['id']}")
        return current if current["state"] in ("succeeded", "failed", "cancelled") else None

    assert wait_for(finished, 120, 0.5, "the job to finish")["state"] == "succeeded"
    with browser_page(width=1280, height=860) as page:
        open_lab(page, lab)
        panel = open_sidebar(page)
        page.locator(f'{SIDEBAR} .jp-mlc-job-row:has(.jp-mlc-job-name:text-is("tb-curve"))').click()
        panel.get_by_role("button", name="Open TensorBoard of job tb-curve").click()
        tab = page.locator(".jp-mlc-tensorboard")
        tab.wait_for(timeout=120_000)
        frame = page.frame_locator(".jp-mlc-tensorboard iframe")
        frame.get_by_text("train/loss").first.wait_for(timeout=120_000)
        # The curve itself: TensorBoard draws each scalar card into a canvas or svg.
        frame.locator("tb-scalar-card, scalar-card").first.wait_for(timeout=60_000)
        page.wait_for_timeout(4_000)  # let the line chart finish drawing
        current = page.get_by_role("tab", name="TensorBoard: tb-curve")
        assert current.get_attribute("aria-selected") == "true"
        save_docs_image(page, "tensorboard.png", artifacts)
