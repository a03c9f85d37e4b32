"""GET /jobs?parent= (issue 35, item 4): a session's cells, a sweep's trials, or with
`none` the top level; every job says its `parent`; a malformed value is 400."""

from __future__ import annotations

from test_grouping import SESSION, SWEEP, fill


async def test_the_jobs_of_a_group_and_the_top_level(api, mlc):
    fill(mlc.service.store)
    code, page, _ = await api("GET", "jobs", params={"parent": SESSION, "limit": 3})
    assert code == 200 and page["total"] == 12
    assert [j["name"] for j in page["jobs"]] == ["train-cell13", "train-cell12", "train-cell11"]
    assert {j["parent"] for j in page["jobs"]} == {SESSION}
    code, page, _ = await api("GET", "jobs", params={"parent": SWEEP})
    assert code == 200 and [j["sweep"]["name"] for j in page["jobs"]] == ["tune-cell4"] * 3
    code, page, _ = await api("GET", "jobs", params={"parent": "none"})
    assert code == 200 and [(j["name"], j["parent"]) for j in page["jobs"]] == [
        ("s", None),
        ("plain", None),
    ]
    code, page, _ = await api("GET", "jobs")  # absent: every job, flat
    assert code == 200 and page["total"] == 17
    code, page, _ = await api("GET", "jobs", params={"parent": "' OR 1=1 --"})
    assert code == 400
