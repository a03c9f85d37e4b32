"""GET /jobs/{id}/metrics?series=...: the series a job logged (mlc.log), from a real job."""

from __future__ import annotations

import textwrap

import pytest

from .helpers import submit, wait_final

LOGS = textwrap.dedent(
    """
    import os
    import jupyterlab_mlcluster as mlc
    rank = int(os.environ["RANK"])
    for i in range(50):
        mlc.log(loss=1.0 / (i + 1) + rank, lr=0.01)
    mlc.log(step=50, loss=float("inf"), acc=0.5)
    """
)


async def test_logged_series_by_name_and_since_a_cursor(api, mlc):
    job = await submit(api, LOGS, workers=2)
    final = await wait_final(api, job["id"])
    assert final["state"] == "succeeded", final
    logged_job = job["id"]
    status, plain, _ = await api("GET", "jobs", logged_job, "metrics")
    assert status == 200
    # Without `series`: the CPU/memory figures as before, and the names only.
    assert plain["logged"]["names"] == ["acc", "loss", "lr"]
    assert plain["logged"]["series"] == []
    assert len(plain["ranks"]) == 2 and "current" in plain["ranks"][0]

    status, body, _ = await api("GET", "jobs", logged_job, "metrics", params={"series": "loss,acc"})
    assert status == 200
    got = {(s["name"], s["rank"]): s for s in body["logged"]["series"]}
    assert sorted(got) == [("acc", 0), ("acc", 1), ("loss", 0), ("loss", 1)]
    loss1 = got[("loss", 1)]
    assert loss1["steps"] == list(range(50)), "the infinite loss at step 50 is not stored"
    assert loss1["values"][0] == 2.0 and loss1["values"][-1] == pytest.approx(1.02)
    assert len(loss1["times"]) == 50 and got[("acc", 0)]["steps"] == [50]

    cursor = body["logged"]["cursor"]
    assert cursor > 0
    status, later, _ = await api(
        "GET", "jobs", logged_job, "metrics", params={"series": "loss", "after": str(cursor)}
    )
    assert status == 200 and later["logged"]["series"] == []
    assert later["logged"]["cursor"] == cursor

    for params in BAD_QUERIES:
        status, error, _ = await api("GET", "jobs", logged_job, "metrics", params=params)
        assert status == 400, (params, error)
        assert list(params)[0] in error["message"]


BAD_QUERIES = [
    {"series": "loss,,lr"},
    {"series": "a\x01b"},
    {"series": ",".join("x" * 51)},
    {"after": "-1"},
    {"after": "soon"},
]
