"""%%distributed --sweep in a real kernel: every trial a real gang job with real ranks."""

from __future__ import annotations

import json

import pytest
from helpers import assert_no_job_processes, wait_for
from kernel_session import outputs

from jupyterlab_mlcluster.jobs.experiments.store import ExperimentStore
from jupyterlab_mlcluster.jobs.experiments.sweeps import expand, parse_sweep

# Every rank must have `x`: the all-reduced sum over 2 ranks, halved, is x only if both had it.
GRID_CELL = """%%distributed --workers 2 --sweep x=1,2,3 --parallel 2
import time, torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.tensor([float(x)])
dist.all_reduce(t)
time.sleep(1.0)
t.item() / 2 * 10
"""


def _value(kernel, expr: str):
    msgs, reply = kernel.execute(expr)
    assert reply["status"] == "ok", reply
    return json.loads(outputs(msgs, "execute_result")[0]["data"]["text/plain"].strip("'"))


def _sweeps(service):
    return ExperimentStore.for_jobs(service.store).list_sweeps()


def test_grid_sweep_with_parallel_2_runs_three_gang_jobs_two_at_a_time(kernel, service):
    msgs, reply = kernel.execute(GRID_CELL, timeout=180)
    assert reply["status"] == "ok", reply
    (result,) = outputs(msgs, "execute_result")
    text = result["data"]["text/plain"]
    assert "3 trials (3 succeeded)" in text, text
    assert "mlc-trial" in result["data"]["text/html"]
    # the trials table was live: shown, then updated in place
    assert any(m["msg_type"] == "update_display_data" for m in msgs)

    values = _value(
        kernel, "import json; json.dumps([[t.params, t.state, t.value] for t in _.trials])"
    )
    assert values == [
        [{"x": 1}, "succeeded", 10.0],
        [{"x": 2}, "succeeded", 20.0],
        [{"x": 3}, "succeeded", 30.0],
    ]
    jobs, _ = service.store.list_jobs(newest_first=False)
    assert len(jobs) == 3
    assert all(j.state == "succeeded" and j.spec.workers == 2 for j in jobs)
    (sweep,) = _sweeps(service)
    assert {j.to_json()["sweep"]["id"] for j in jobs} == {sweep["id"]}
    # Never more than 2 trials running: count overlaps from the store's timestamps.
    events = sorted(
        [(j.started, 1) for j in jobs] + [(j.finished, -1) for j in jobs],
        key=lambda e: (e[0], e[1]),
    )
    running = peak = 0
    for _, delta in events:
        running += delta
        peak = max(peak, running)
    assert peak == 2  # the limit was reached (the third waited) and never passed
    third = max(jobs, key=lambda j: j.started)
    assert third.started >= min(j.finished for j in jobs if j.id != third.id)
    assert_no_job_processes(service)


RANDOM_CELL = """%%distributed --sweep lr=loguniform(1e-4,1e-1) --sweep act=choice('relu','gelu') --trials 3 --seed {seed} --framework none
{{"lr": lr, "act": act}}
"""


def test_random_search_draws_reproducibly_with_a_seed(kernel, service):
    kernel.execute("import json")
    draws = []
    for seed in (7, 7, 8):
        _msgs, reply = kernel.execute(RANDOM_CELL.format(seed=seed), timeout=120)
        assert reply["status"] == "ok", reply
        draws.append(_value(kernel, "json.dumps([[t.params, t.value] for t in _.trials])"))
    expected = expand(
        parse_sweep(["lr=loguniform(1e-4,1e-1)", "act=choice('relu','gelu')"], trials=3, seed=7)
    )
    assert [params for params, _ in draws[0]] == expected
    # what the ranks saw is what was drawn
    assert all(params == value for params, value in draws[0])
    assert draws[0] == draws[1]
    assert draws[2] != draws[0]
    assert all(1e-4 <= p["lr"] <= 1e-1 for p, _ in draws[0])


def test_a_failing_trial_fails_alone_and_the_table_says_why(kernel, service):
    cell = (
        "%%distributed --workers 2 --sweep x=1,2,3 --metric score --mode max --pull score,x --framework none\n"
        "if x == 2:\n    raise ValueError(f'bad x {x}')\nscore = x * 1.5\n"
    )
    msgs, reply = kernel.execute(cell, timeout=120)
    assert reply["status"] == "ok", reply
    text = outputs(msgs, "execute_result")[0]["data"]["text/plain"]
    assert "2 succeeded" in text and "1 failed" in text, text
    assert "ValueError: bad x 2" in text
    kernel.execute("sweep = _")
    states = _value(kernel, "import json; json.dumps([t.state for t in sweep.trials])")
    assert states == ["succeeded", "failed", "succeeded"]
    # --pull brought the best trial's (max score) variables back
    assert _value(kernel, "json.dumps([x, score, sweep.best.index])") == [3, 4.5, 2]


@pytest.mark.parametrize(
    "line, message",
    [
        ("--sweep lr=", "no values"),
        ("--sweep lr=normal(0,1) --trials 3", "unknown distribution 'normal'"),
        (
            "--sweep a="
            + ",".join(map(str, range(11)))
            + " --sweep b="
            + ",".join(map(str, range(11)))
            + " --sweep c="
            + ",".join(map(str, range(11))),
            "1331 combinations",
        ),
        ("--sweep lr=uniform(0,1)", "--trials N"),
        ("--sweep lr=loguniform(0,1) --trials 2", "must be positive"),
        ("--sweep x=1,2 --parallel 0", "--parallel must be a positive integer"),
        ("--sweep x=1,2 --mode best", "--mode must be min or max"),
        ("--trials 3", "only apply to a sweep"),
    ],
)
def test_bad_sweeps_submit_nothing(kernel, service, line, message):
    kernel.execute("pass")  # (ipykernel reports a first-cell UsageError without a reply)
    _msgs, reply = kernel.execute(f"%%distributed {line}\nprint('never')\n")
    assert reply["status"] == "error"
    assert reply["ename"] == "UsageError"
    assert message in reply["evalue"], reply["evalue"]
    assert service.store.list_jobs()[1] == 0
    assert _sweeps(service) == []


def test_interrupt_cancels_every_trial(kernel, service):
    msg_id = kernel.kc.execute(
        "%%distributed --workers 2 --framework none --sweep x=1,2,3 --parallel 1\n"
        "import time\ntime.sleep(300)\n"
    )
    wait_for(
        lambda: [
            j
            for j in service.store.list_jobs()[0]
            if j.ranks and all(r.state == "running" for r in j.ranks)
        ],
        timeout=60,
        message="the first trial running",
    )
    # Each waiting trial's supervisor says why once it asks for a slot (it may start after
    # the first trial already runs, now that trials start fast).
    wait_for(
        lambda: (
            len(queued := [j for j in service.store.list_jobs()[0] if j.state == "queued"]) == 2
            and all("sweep slot" in (j.reason or "") for j in queued)
        ),
        timeout=60,
        message="the other two trials waiting for a sweep slot",
    )
    kernel.km.interrupt_kernel()
    _msgs, reply = kernel.collect(msg_id, timeout=60)
    assert reply["status"] == "error"
    jobs, total = service.store.list_jobs()
    assert total == 3 and {str(j.state) for j in jobs} == {"cancelled"}
    assert all(j.started is None for j in jobs if j.origin["sweep"]["trial"] != 0)  # never started
    assert_no_job_processes(service)


def test_schedule_registers_the_cell_and_its_pushed_variables(kernel, service):
    from jupyterlab_mlcluster.jobs.experiments.scheduler import Scheduler

    kernel.execute("factor = 7")
    msgs, reply = kernel.execute(
        '%%distributed --schedule "30 2 * * *" --name nightly --push factor --framework none\n'
        "print('factor is', factor)\nfactor * 6\n"
    )
    assert reply["status"] == "ok", reply
    text = "".join(m["text"] for m in outputs(msgs, "stream"))
    assert "schedule nightly registered: 30 2 * * * (UTC), next run" in text
    assert service.store.list_jobs()[1] == 0  # registered, not run now
    (row,) = ExperimentStore.for_jobs(service.store).list_schedules()
    assert row["owner"] and row["origin"]["kind"] == "kernel"
    # the variable travels with the schedule: it is changed in the kernel, the run keeps 7
    kernel.execute("factor = 1")
    (fired,) = Scheduler(service).fire_due(now=row["last_tick"] + 86400)
    record = service.wait(fired["job_id"], timeout=60)
    assert str(record.state) == "succeeded" and record.name.startswith("nightly-")
    assert service.result(record.id) == ("value", 42)
    _msgs, reply = kernel.execute('%%distributed --schedule "30 2 * * *" --name nightly\npass\n')
    assert reply["status"] == "error" and "exists already" in reply["evalue"]
    _msgs, reply = kernel.execute('%%distributed --schedule "30 2 * *" --name other\npass\n')
    assert reply["status"] == "error" and "five fields" in reply["evalue"]
