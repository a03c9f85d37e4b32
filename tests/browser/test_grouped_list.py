"""The grouped job list (issue 35, item 4) and Export… (item 5) in a real JupyterLab and
chromium, against canned API answers (fake_api.py): a session's cells under the session, a
sweep's trials under the sweep, closed at first, opened by the caret or the keyboard, live;
a job's details download its export. Screenshots: artifacts/browser/ (and docs/img with
MLCLUSTER_DOCS_IMG, scripts/screenshots.sh)."""

from __future__ import annotations

import io
import json
import zipfile

import pytest

from .fake_api import FakeApi, job
from .lab import (
    DARK_THEME,
    LIGHT_THEME,
    SIDEBAR,
    browser_page,
    open_lab,
    open_sidebar,
    save_docs_image,
    set_theme,
)

SESSION, SWEEP = "j5e5510000a", "s5eee900001"


def cell(n: int, state: str, minute: int) -> dict:
    created = f"2026-11-22T01:{minute:02d}:00.000Z"
    return job(
        f"jc{n:09d}",
        f"train-cell{n}",
        state,
        2,
        created=created,
        parent=SESSION,
        origin={"kind": "kernel", "notebook": "train.ipynb", "cell": n},
        session={"name": "warm", "id": SESSION, "cell": True},
        sweep=None,
    )


def trial(i: int, state: str) -> dict:
    return job(
        f"jt{i:09d}",
        f"tune-cell9-t{i}",
        state,
        1,
        created=f"2026-11-22T00:5{i}:00.000Z",
        parent=SWEEP,
        origin={"kind": "kernel", "notebook": "tune.ipynb", "cell": 9},
        sweep={"id": SWEEP, "trial": i, "parallel": 2, "name": "tune-cell9"},
        session=None,
    )


def grouped_fixture() -> FakeApi:
    api = FakeApi()
    session = job(
        SESSION,
        "warm",
        "running",
        2,
        created="2026-11-22T00:40:00.000Z",
        parent=None,
        session={"name": "warm", "id": SESSION, "cell": False},
        sweep=None,
    )
    jobs = [
        session,
        *(cell(n, "succeeded", n) for n in range(2, 7)),
        cell(7, "running", 8),
        trial(0, "succeeded"),
        trial(1, "running"),
        trial(2, "queued"),
        job("jplain00001", "eval", "succeeded", 2, created="2026-11-22T00:10:00.000Z", parent=None),
    ]
    for j in jobs:
        api.jobs[j["id"]] = j
    return api


@pytest.fixture(scope="module")
def grouped_page(lab):
    with browser_page(width=1280, height=860) as page:
        fake = grouped_fixture()
        fake.install(page)
        open_lab(page, lab)
        open_sidebar(page)
        page.wait_for_selector(f"{SIDEBAR} .jp-mlc-connection-live")
        page.console_errors.clear()  # type: ignore[attr-defined]  # the fake's 503: no cluster
        yield page, fake


def top_rows(page):
    return page.locator(f"{SIDEBAR} .jp-mlc-job-list > li")


def names(locator) -> list[str]:
    return locator.locator(".jp-mlc-job-name").all_inner_texts()


def test_cells_and_trials_are_grouped_and_open_live(grouped_page, artifacts):
    page, fake = grouped_page
    page.wait_for_function(
        f"document.querySelectorAll('{SIDEBAR} .jp-mlc-job-list > li').length === 3"
    )
    # Three rows, not eleven: the session (running), the sweep, the plain job.
    assert names(top_rows(page)) == ["warm", "tune-cell9", "eval"]
    session = page.locator(f'{SIDEBAR} [data-group-id="{SESSION}"]')
    assert "6 cells, 1 running" in session.inner_text()
    sweep = page.locator(f'{SIDEBAR} [data-group-id="{SWEEP}"]')
    assert "3 trials, 1 running, 1 queued" in sweep.inner_text()
    assert session.locator(".jp-mlc-group-children").count() == 0
    save_docs_image(page, "sidebar-groups-closed.png", artifacts, locator=page.locator(SIDEBAR))

    # The caret opens the session (without opening the session's details); its cells come
    # newest first, each named after its notebook and cell.
    session.locator(".jp-mlc-group-toggle").first.click()
    children = session.locator(".jp-mlc-group-children .jp-mlc-job-row")
    assert names(children)[:3] == ["train-cell7", "train-cell6", "train-cell5"]
    assert children.count() == 6
    assert session.locator('[aria-expanded="true"]').count() == 1
    # The keyboard opens the sweep: Right on its row, Left closes it again.
    sweep_row = sweep.locator(".jp-mlc-group-row")
    sweep_row.focus()
    page.keyboard.press("ArrowRight")
    assert names(sweep.locator(".jp-mlc-group-children")) == [
        "tune-cell9-t1",
        "tune-cell9-t2",
        "tune-cell9-t0",
    ]
    # Live: a new cell of the session shows under it, and its summary counts it.
    fake.push({"type": "job", "job": cell(8, "running", 9)})
    page.wait_for_function(
        f'document.querySelectorAll(\'{SIDEBAR} [data-group-id="{SESSION}"] '
        ".jp-mlc-group-children .jp-mlc-job-row').length === 7"
    )
    assert names(children)[0] == "train-cell8"
    assert "7 cells, 2 running" in session.inner_text()
    save_docs_image(page, "sidebar-groups.png", artifacts, locator=page.locator(SIDEBAR))
    set_theme(page, DARK_THEME)
    try:
        save_docs_image(page, "sidebar-groups-dark.png", artifacts, locator=page.locator(SIDEBAR))
    finally:
        set_theme(page, LIGHT_THEME)
    sweep_row.focus()
    page.keyboard.press("ArrowLeft")
    assert sweep.locator(".jp-mlc-group-children").count() == 0
    assert not page.console_errors  # type: ignore[attr-defined]


def test_a_jobs_details_download_its_export(grouped_page, artifacts):
    page, fake = grouped_page
    archive = io.BytesIO()
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("train_cell7.py", "print('hi')\n")
    asked: list[str] = []

    def export(route) -> None:
        asked.append(route.request.method + " " + route.request.url.split("/mlcluster/api/")[1])
        route.fulfill(status=200, body=archive.getvalue(), content_type="application/zip")

    page.route("**/mlcluster/api/jobs/*/export?*", export)
    try:
        session = page.locator(f'{SIDEBAR} [data-group-id="{SESSION}"]')
        if session.locator(".jp-mlc-group-children").count() == 0:
            session.locator(".jp-mlc-group-toggle").first.click()
        session.locator('.jp-mlc-group-children [data-job-id="jc000000007"]').click()
        page.locator(SIDEBAR).get_by_role("button", name="Export job train-cell7").click()
        dialog = page.locator(".jp-Dialog")
        dialog.locator("select").select_option(index=1)  # sbatch
        with page.expect_download() as download:
            dialog.get_by_role("button", name="OK").click()
        got = download.value
        assert got.suggested_filename == "train-cell7-sbatch.zip"
        assert zipfile.ZipFile(got.path()).namelist() == ["train_cell7.py"]
        assert asked == ["POST jobs/jc000000007/export?as=sbatch"]
    finally:
        page.unroute("**/mlcluster/api/jobs/*/export?*")
        back = page.locator(SIDEBAR).get_by_role("button", name="Back to all jobs")
        if back.count():
            back.first.click()
    # Back on the list, the cell's group is still open and its row focused.
    session = page.locator(f'{SIDEBAR} [data-group-id="{SESSION}"]')
    assert session.locator(".jp-mlc-group-children").count() == 1
    assert json.loads(json.dumps(fake.requests[-1]))  # the fake saw the panel's requests
