"""Sweeps and schedules over REST, and the server firing schedules (a real Jupyter server,
real supervisors and ranks). Replies are checked against the OpenAPI document."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import jsonschema
import pytest

from jupyterlab_mlcluster.jobs.experiments.scheduler import create_schedule
from jupyterlab_mlcluster.jobs.experiments.store import ExperimentStore
from jupyterlab_mlcluster.jobs.experiments.sweep import submit_sweep
from jupyterlab_mlcluster.jobs.experiments.sweeps import parse_sweep
from jupyterlab_mlcluster.jobs.model import JobSpec
from jupyterlab_mlcluster.runtime.payload import Payload
from jupyterlab_mlcluster.server.openapi import build_document


def check(schema: str, value: Any) -> None:
    schemas = build_document(max_workers=8)["components"]["schemas"]
    jsonschema.validate(
        value,
        {**schemas[schema], "components": {"schemas": schemas}},
        format_checker=jsonschema.FormatChecker(),
    )


def add_schedule(service, name: str, owner: str, *, overdue: bool = True) -> None:
    """A per-minute schedule whose latest tick is already due (it last ran 2 minutes ago)."""
    create_schedule(
        service,
        spec=JobSpec.from_options({"framework": "none"}),
        payload=Payload(kind="code", source="print('scheduled')\n"),
        options={"name": name, "cron": "* * * * *"},
        owner=owner,
        origin={"kind": "test"},
        now=time.time() - (120 if overdue else 0),
    )


async def wait_until(predicate, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.1)
    return value


@pytest.fixture
def mlc_config() -> dict[str, Any]:
    return {"MLClusterApp": {"schedule_interval": 0.2}}


async def test_the_server_fires_a_due_schedule_and_rest_manages_it(api, mlc):
    service = mlc.service
    add_schedule(service, "nightly", "me")
    store = ExperimentStore.for_jobs(service.store)
    run = await wait_until(lambda: [r for r in store.runs("nightly") if r["job_id"]])
    await asyncio.to_thread(service.wait, run[0]["job_id"], 60)
    job = service.store.get_job(run[0]["job_id"])
    assert str(job.state) == "succeeded" and job.name.startswith("nightly-")
    assert job.origin["schedule"] == "nightly"

    code, listing, _ = await api("GET", "schedules")
    assert code == 200
    check("ScheduleList", listing)
    (row,) = listing["schedules"]
    assert row["name"] == "nightly" and row["last_run"]["job_id"] == job.id
    assert row["last_run"]["job_name"] == job.name and row["next_run"] > row["last_run"]["tick"]
    code, runs, _ = await api("GET", "schedules", "nightly", "runs")
    assert code == 200 and runs["runs"][0]["job_id"] == job.id
    check("ScheduleRunList", runs)

    code, paused, _ = await api("POST", "schedules", "nightly", "pause")
    assert code == 200 and paused["suspended"] is True and paused["next_run"] is None
    check("Schedule", paused)
    code, resumed, _ = await api("POST", "schedules", "nightly", "resume")
    assert code == 200 and resumed["suspended"] is False

    code, _, _ = await api("DELETE", "schedules", "nightly")
    assert code == 204
    for path in (("schedules", "nightly"), ("schedules", "nightly", "runs")):
        code, body, _ = await api("GET", *path)
        assert code == 404 and "no schedule 'nightly'" in body["message"]
    code, _, _ = await api("GET", "schedules", "Not_A_Name")
    assert code == 404
    # its run is an ordinary job and stays
    code, body, _ = await api("GET", "jobs", job.id)
    assert code == 200 and body["name"] == job.name


async def test_sweeps_over_rest(api, mlc):
    service = mlc.service
    spec = JobSpec.from_options({"framework": "none", "workers": 2})
    payload = Payload(kind="code", source="{'loss': 1 / x}\n")
    sweep = await asyncio.to_thread(
        submit_sweep,
        service,
        spec,
        payload,
        parse_sweep(["x=1,2,4"], metric="loss", parallel=2),
        origin={"kind": "test", "user": "me"},
    )
    await asyncio.to_thread(sweep.wait, 60)
    code, body, _ = await api("GET", "sweeps", sweep.id)
    assert code == 200, body
    check("Sweep", body)
    assert [t["metric"] for t in body["trials"]] == [1.0, 0.5, 0.25]
    assert body["best"] == 2 and body["state"] == "succeeded" and body["parallel"] == 2
    assert body["params"] == {"x": "1,2,4"}
    code, listing, _ = await api("GET", "sweeps")
    assert code == 200 and [s["id"] for s in listing["sweeps"]] == [sweep.id]
    check("SweepList", listing)
    code, job, _ = await api("GET", "jobs", body["trials"][0]["job_id"])
    assert code == 200 and job["sweep"] == {
        "id": sweep.id,
        "trial": 0,
        "parallel": 2,
        "name": "job",  # an unnamed sweep from no notebook or script
    }
    for bad in ("s0000000000", "nope", "../x"):
        code, _, _ = await api("GET", "sweeps", bad)
        assert code == 404


class TestSharedServer:
    """A server shared through an authenticating proxy: mallory against alice's schedule."""

    @pytest.fixture
    def mlc_config(self) -> dict[str, Any]:
        return {"MLClusterApp": {"trust_identity_header": True, "schedule_interval": 0}}

    async def test_another_users_schedules_and_sweeps_look_missing(self, api, mlc):
        add_schedule(mlc.service, "alices", "alice@example.com", overdue=False)
        alice = {"kubeflow-userid": "alice@example.com"}
        mallory = {"kubeflow-userid": "mallory@example.com"}
        code, listing, _ = await api("GET", "schedules", headers=mallory)
        assert code == 200 and listing["schedules"] == []
        for method, path in (
            ("GET", ("schedules", "alices")),
            ("GET", ("schedules", "alices", "runs")),
            ("POST", ("schedules", "alices", "pause")),
            ("DELETE", ("schedules", "alices")),
        ):
            code, body, _ = await api(method, *path, headers=mallory)
            assert code == 404 and body["message"] == "no schedule 'alices'", (method, path)
        code, body, _ = await api("GET", "schedules", "alices", headers=alice)
        assert code == 200 and body["suspended"] is False  # untouched by mallory
        code, _, _ = await api("GET", "schedules")  # no identity at all
        assert code == 403
        # schedule_interval 0: this server fired nothing
        await asyncio.sleep(0.5)
        assert mlc.service.store.list_jobs()[1] == 0
