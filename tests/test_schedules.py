"""Scheduled trainings: the CLI, real `mlcluster scheduler` daemons (two at once), real jobs.

Time is made testable with the daemons' `--clock START@30` (a simulated minute per two real
seconds, the same for every daemon given the same START), so a per-minute cron ticks every
two seconds and the tests stay short; assertions count ticks and runs, never tight timings.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import time

import pytest
from helpers import assert_no_job_processes, run_cli, wait_for

from jupyterlab_mlcluster.jobs.experiments.scheduler import Scheduler, create_schedule
from jupyterlab_mlcluster.jobs.experiments.schedules import (
    ScheduleError,
    due_tick,
    schedule_options,
)
from jupyterlab_mlcluster.jobs.experiments.store import SUBMIT_STALE_AFTER, ExperimentStore
from jupyterlab_mlcluster.jobs.model import JobSpec
from jupyterlab_mlcluster.runtime.payload import Payload


@pytest.fixture
def script(tmp_path):
    def make(body: str) -> str:
        path = tmp_path / "train.py"
        path.write_text(body)
        return str(path)

    return make


def start_daemons(count: int, clock: str, interval: float = 0.2) -> list[subprocess.Popen]:
    # Cold supervisors: the first submit would otherwise wait seconds for the warm pool's
    # zygote to import torch, and a late scheduler runs only the latest missed tick.
    env = dict(os.environ, MLCLUSTER_WARM_POOL="0")
    return [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "jupyterlab_mlcluster.cli",
                "scheduler",
                "--interval",
                str(interval),
                "--clock",
                clock,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
        for _ in range(count)
    ]


def stop_daemons(daemons: list[subprocess.Popen]) -> list[str]:
    outputs = []
    for proc in daemons:
        proc.send_signal(signal.SIGTERM)
    for proc in daemons:
        out, _ = proc.communicate(timeout=30)
        assert proc.returncode == 0, out
        outputs.append(out)
    return outputs


def fired(outputs: list[str]) -> list[dict]:
    items = []
    for out in outputs:
        for line in out.splitlines():
            if line.startswith("{"):
                items.append(json.loads(line))
    return items


def add_every_minute(name: str, path, *options: str):
    """`mlcluster schedule add` of a plain script firing each minute, keeping 100 runs."""
    added = run_cli(
        "schedule", "add", "--cron", "* * * * *", "--name", name, "--framework", "none",
        "--successful-history", "100", *options, path,
    )  # fmt: skip
    assert added.returncode == 0, added.stderr
    return added


def test_two_daemons_fire_each_minute_exactly_once(service, script):
    path = script("print('tick run')\n")
    added = add_every_minute("every", path)
    assert "schedule every added: * * * * * (UTC)" in added.stdout
    daemons = start_daemons(2, f"{time.time():.3f}@30")
    try:
        store = ExperimentStore.for_jobs(service.store)
        wait_for(lambda: len(store.runs("every")) >= 5, timeout=60, message="5 runs")
    finally:
        outputs = stop_daemons(daemons)
    runs = sorted(store.runs("every"), key=lambda r: r["tick"])
    ticks = [r["tick"] for r in runs]
    # one run per minute: consecutive whole minutes, none twice, none skipped
    assert all(t % 60 == 0 for t in ticks)
    assert [b - a for a, b in itertools.pairwise(ticks)] == [60.0] * (len(ticks) - 1)
    submitted = [i for i in fired(outputs) if i["outcome"] == "submitted"]
    assert len(submitted) == len(runs)  # each tick fired by exactly one of the two daemons
    assert sorted(i["tick"] for i in submitted) == ticks
    jobs, _ = service.store.list_jobs()
    assert sorted(j.id for j in jobs) == sorted(r["job_id"] for r in runs)
    names = {j.name for j in jobs}
    assert len(names) == len(jobs) and all(n.startswith("every-20") for n in names)
    for record in jobs:
        service.wait(record.id, timeout=60)
    assert {str(service.store.get_job(r["job_id"]).state) for r in runs} == {"succeeded"}
    assert "tick run" in service.logs(runs[0]["job_id"])[0][0]["line"]
    listed = run_cli("schedule", "runs", "every")
    assert listed.returncode == 0 and runs[0]["job_id"] in listed.stdout
    assert_no_job_processes(service)


def test_forbid_skips_ticks_while_a_run_is_active_and_delete_stops_it(service, script):
    path = script("import time\ntime.sleep(5)\n")  # 2.5 simulated minutes
    add_every_minute("slow", path, "--concurrency", "Forbid")
    store = ExperimentStore.for_jobs(service.store)
    daemons = start_daemons(2, f"{time.time():.3f}@30")
    try:
        wait_for(
            lambda: len([r for r in store.runs("slow") if r["job_id"]]) >= 2,
            timeout=60,
            message="two runs",
        )
        wait_for(
            lambda: any(r["outcome"].startswith("skipped") for r in store.runs("slow")),
            timeout=30,
            message="a tick skipped by Forbid",
        )
        deleted = run_cli("schedule", "delete", "slow")
        assert deleted.returncode == 0, deleted.stderr
        jobs_at_delete = service.store.list_jobs()[1]
        time.sleep(6.0)  # three more simulated minutes with both daemons running
        assert service.store.list_jobs()[1] == jobs_at_delete  # delete stopped it
    finally:
        stop_daemons(daemons)
    jobs, _ = service.store.list_jobs(newest_first=False)
    for record in jobs:
        service.wait(record.id, timeout=60)
    jobs, _ = service.store.list_jobs(newest_first=False)
    # Forbid: never two runs at once
    for a, b in itertools.pairwise(jobs):
        assert b.started >= a.finished, (a.to_json(), b.to_json())
    assert all(str(j.state) == "succeeded" for j in jobs)
    assert run_cli("schedule", "runs", "slow").returncode == 2  # gone
    assert_no_job_processes(service)


# -- the same policies, deterministic: Scheduler.fire_due with explicit times --------------


def _schedule(service, tmp_path, name="nightly", **options):
    path = tmp_path / "job.py"
    path.write_text("import time\ntime.sleep(30)\n")
    return create_schedule(
        service,
        spec=JobSpec.from_options({"framework": "none"}),
        payload=Payload(kind="script", filename=str(path)),
        options=dict(name=name, **options),
        owner="alice",
        origin={"kind": "test"},
        now=1_000_000_000.0,  # 2001-09-09T01:46:40Z
    )


def test_forbid_records_a_skipped_tick_and_replace_cancels_the_active_run(service, tmp_path):
    _schedule(service, tmp_path, "forbid", cron="0 * * * *", concurrency="Forbid")
    _schedule(service, tmp_path, "replace", cron="0 * * * *", concurrency="Replace")
    scheduler = Scheduler(service)
    first = 1_000_000_000.0 - 400 + 3600  # 02:00
    done = {d["schedule"]: d for d in scheduler.fire_due(now=first + 5)}
    assert done["forbid"]["outcome"] == done["replace"]["outcome"] == "submitted"
    # nothing is due again within the hour; a second pass claims nothing
    assert scheduler.fire_due(now=first + 10) == []
    done2 = {d["schedule"]: d for d in scheduler.fire_due(now=first + 3600 + 5)}
    assert done2["forbid"]["outcome"] == "skipped"
    assert done2["replace"]["outcome"] == "submitted"
    assert str(service.store.get_job(done["replace"]["job_id"]).state) == "cancelled"
    assert not service.store.get_job(done["forbid"]["job_id"]).final
    runs = ExperimentStore.for_jobs(service.store).runs("forbid")
    assert [r["outcome"] for r in runs] == ["skipped: a run is still active", "submitted"]
    assert service.store.get_job(done["forbid"]["job_id"]).name == "forbid-200109090200"
    for record in service.store.list_jobs()[0]:
        service.cancel(record.id)


def test_missed_ticks_run_once_or_not_past_the_starting_deadline(service, tmp_path):
    _schedule(service, tmp_path, "late", cron="*/10 * * * *", starting_deadline="5m")
    _schedule(service, tmp_path, "catchup", cron="*/10 * * * *", timezone="Europe/Paris")
    scheduler = Scheduler(service)
    # away for an hour: 6 ticks missed; the latest (02:40) is 7 minutes old
    done = {d["schedule"]: d for d in scheduler.fire_due(now=1_000_000_000.0 + 3600 + 20)}
    assert done["late"]["outcome"] == "missed"
    assert done["catchup"]["outcome"] == "submitted"  # once, not six times
    assert service.store.get_job(done["catchup"]["job_id"]).name == "catchup-200109090440"
    assert len(service.store.list_jobs()[0]) == 1
    for record in service.store.list_jobs()[0]:
        service.cancel(record.id)


def test_paused_schedules_do_not_fire_and_history_limits_trim_old_runs(service, tmp_path):
    _schedule(service, tmp_path, "paused", cron="* * * * *")
    store = ExperimentStore.for_jobs(service.store)
    store.set_suspended("paused", True)
    scheduler = Scheduler(service)
    assert scheduler.fire_due(now=1_000_000_000.0 + 600) == []
    store.set_suspended("paused", False)
    assert scheduler.fire_due(now=1_000_000_000.0 + 660)[0]["outcome"] == "submitted"


@pytest.mark.parametrize(
    "options, message",
    [
        ({"name": "x", "cron": "0 2 * *"}, "five fields"),
        ({"name": "x", "cron": "61 * * * *"}, "not valid"),
        ({"name": "x", "cron": "0 2 * * *", "timezone": "Mars/Olympus"}, "unknown time zone"),
        (
            {"name": "x", "cron": "0 2 * * *", "concurrency": "Sometimes"},
            "Allow, Forbid or Replace",
        ),
        ({"name": "Bad_Name", "cron": "0 2 * * *"}, "schedule name"),
        ({"name": "x", "cron": "0 2 * * *", "starting_deadline": "soon"}, "--starting-deadline"),
        ({"name": "x", "cron": "0 2 * * *", "failed_history": "-1"}, "must not be negative"),
    ],
)
def test_bad_schedules_are_refused(options, message):
    with pytest.raises(ScheduleError, match=message):
        schedule_options(**options)


def test_bad_schedule_on_the_command_line_stores_nothing(service, script):
    path = script("pass\n")
    result = run_cli("schedule", "add", "--cron", "0 2 * *", "--name", "n", path)
    assert result.returncode == 2 and "five fields" in result.stderr
    result = run_cli("schedule", "add", "--cron", "0 2 * * *", path)
    assert result.returncode == 2 and "needs a name" in result.stderr
    assert ExperimentStore.for_jobs(service.store).list_schedules() == []
    assert run_cli("schedule", "add", "--cron", "0 2 * * *", "--name", "n", path).returncode == 0
    again = run_cli("schedule", "add", "--cron", "0 3 * * *", "--name", "n", path)
    assert again.returncode == 2 and "exists already" in again.stderr
    (row,) = ExperimentStore.for_jobs(service.store).list_schedules()
    assert row["cron"] == "0 2 * * *"


def test_due_tick_is_the_latest_tick_not_after_now():
    assert due_tick("* * * * *", "UTC", 0, 120.0) == 120.0
    assert due_tick("* * * * *", "UTC", 0, 119.5) == 60.0
    assert due_tick("* * * * *", "UTC", 120.0, 179.0) is None


def test_a_claim_left_by_a_dead_scheduler_does_not_block_forbid_forever(service, tmp_path):
    _schedule(service, tmp_path, "orphan", cron="0 * * * *", concurrency="Forbid")
    store = ExperimentStore.for_jobs(service.store)
    first = 1_000_000_000.0 - 400 + 3600
    # a scheduler claims the tick and dies before submitting
    assert store.claim_tick("orphan", first, True) == ("claimed", [])
    # while that claim is fresh, Forbid counts it as a run being submitted
    assert store.claim_tick("orphan", first + 3600, True)[0] == "skipped"
    store.database.connection.execute(
        "UPDATE schedule_runs SET fired = fired - ? WHERE schedule = 'orphan'",
        (SUBMIT_STALE_AFTER + 1,),
    )
    assert store.claim_tick("orphan", first + 7200, True)[0] == "claimed"
