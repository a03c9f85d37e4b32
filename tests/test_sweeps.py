"""Sweeps: parsing and expansion (pure), and `mlcluster run --sweep` / `mlcluster sweeps`."""

from __future__ import annotations

import json

import pytest
from helpers import assert_no_job_processes, run_cli

from jupyterlab_mlcluster.jobs.experiments.sweeps import (
    SweepError,
    best_index,
    expand,
    metric_of,
    parse_param,
    parse_sweep,
)


def test_grid_is_the_product_in_option_order():
    spec = parse_sweep(["lr=0.1,0.01", "batch=32,64", "act='relu',gelu"])
    trials = expand(spec)
    assert len(trials) == 8
    assert trials[0] == {"lr": 0.1, "batch": 32, "act": "relu"}
    assert trials[-1] == {"lr": 0.01, "batch": 64, "act": "gelu"}


def test_random_search_is_seeded_and_within_bounds():
    options = ["lr=loguniform(1e-4,1e-1)", "p=uniform(0,1)", "n=choice(1,2,(3, 4))"]
    a = expand(parse_sweep(options, trials=50, seed=3))
    assert a == expand(parse_sweep(options, trials=50, seed=3))
    assert a != expand(parse_sweep(options, trials=50, seed=4))
    assert all(1e-4 <= t["lr"] <= 1e-1 and 0 <= t["p"] <= 1 for t in a)
    assert {t["n"] for t in a} == {1, 2, (3, 4)}


@pytest.mark.parametrize(
    "option, message",
    [
        ("lr=", "no values"),
        ("lr", "NAME=V1,V2"),
        ("=1,2", "NAME=V1,V2"),
        ("1x=1,2", "not a Python variable name"),
        ("lr=normal(0,1)", "unknown distribution 'normal'"),
        ("lr=uniform(1)", "two bounds"),
        ("lr=uniform(2,1)", "low < high"),
        ("lr=uniform(a,b)", "must be numbers"),
        ("lr=uniform(0,inf)", "finite"),
        ("lr=loguniform(-1,1)", "positive"),
        ("lr=1,,2", "empty value"),
        ("lr=choice()", "needs its arguments"),
    ],
)
def test_bad_parameters_are_refused(option, message):
    with pytest.raises(SweepError, match=message):
        parse_param(option)


def test_sweep_wide_checks():
    with pytest.raises(SweepError, match="given twice"):
        parse_sweep(["a=1,2", "a=3"])
    with pytest.raises(SweepError, match="1331 combinations"):
        parse_sweep([f"{n}={','.join(map(str, range(11)))}" for n in "abc"])
    assert (
        len(expand(parse_sweep([f"{n}={','.join(map(str, range(11)))}" for n in "abc"], trials=5)))
        == 5
    )
    with pytest.raises(SweepError, match="at most 1000"):
        parse_sweep(["a=1"], trials=1001)
    with pytest.raises(SweepError, match="only apply to a sweep"):
        parse_sweep(None, parallel=2)
    assert parse_sweep(None) is None


def test_metric_and_best():
    assert metric_of({"loss": 0.5}, "loss") == 0.5
    assert metric_of(0.7, None) == 0.7
    assert metric_of("text", "loss") is None
    assert best_index([0.3, None, 0.1, "x", 0.1], "min") == 2
    assert best_index([0.3, None, 0.9], "max") == 2
    assert best_index([None, float("nan")], "max") is None


def test_cli_sweep_passes_params_as_arguments_and_lists_the_sweep(service, tmp_path):
    script = tmp_path / "train.py"
    script.write_text(
        "import sys\nargs = dict(a[2:].split('=') for a in sys.argv[1:])\n"
        "print('lr', args['lr'], 'batch', args['batch'])\n"
        "if args['lr'] == '0.5':\n    raise SystemExit('diverged')\n"
    )
    result = run_cli(
        "run",
        "--framework",
        "none",
        "--workers",
        "2",
        "--sweep",
        "lr=0.1,0.5",
        "--sweep",
        "batch=32",
        "--parallel",
        "1",
        str(script),
    )
    assert result.returncode == 1, result.stderr  # one trial failed
    assert (
        "Sweep s" in result.stdout
        and "1 succeeded" in result.stdout
        and "1 failed" in result.stdout
    )
    jobs, _ = service.store.list_jobs(newest_first=False)
    assert [j.spec.workers for j in jobs] == [2, 2]
    lines = [line["line"] for line in service.logs(jobs[0].id)[0]]
    assert lines.count("lr 0.1 batch 32") == 2  # both ranks got the arguments
    listed = run_cli("sweeps", "--json")
    (sweep,) = json.loads(listed.stdout)
    assert sweep["state"] == "succeeded" and [t["state"] for t in sweep["trials"]] == [
        "succeeded",
        "failed",
    ]
    assert sweep["trials"][1]["params"] == {"lr": 0.5, "batch": 32}
    shown = run_cli("sweeps", sweep["id"])
    assert shown.returncode == 0 and jobs[1].id in shown.stdout
    assert run_cli("sweeps", "snope").returncode == 2
    bad = run_cli("run", "--sweep", "lr=", str(script))
    assert bad.returncode == 2 and "no values" in bad.stderr
    assert service.store.list_jobs()[1] == 2
    assert_no_job_processes(service)


def test_interrupting_a_sweep_while_it_submits_leaves_no_trial_running(service, tmp_path):
    import signal
    import subprocess
    import sys

    from helpers import wait_for

    script = tmp_path / "slow.py"
    script.write_text("import time\ntime.sleep(120)\n")
    cli = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "jupyterlab_mlcluster.cli",
            "run",
            "--framework",
            "none",
            "--sweep",
            "x=" + ",".join(map(str, range(60))),
            "--parallel",
            "1",
            str(script),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    wait_for(lambda: service.store.list_jobs()[1] >= 3, timeout=60, message="three trials")
    cli.send_signal(signal.SIGINT)
    cli.communicate(timeout=120)
    assert cli.returncode != 0
    jobs, total = service.store.list_jobs()
    assert 3 <= total < 60  # cut short while submitting
    # A trial stored in the very moment of the interrupt, before its supervisor started, is
    # never run: the CLI's cleanup asks to cancel it and the next reap settles it (or, were
    # the CLI killed outright, the reap after the supervisor's claim grace: its submitter is
    # gone). tests/faults/test_interrupts.py lands the interrupt on every line.
    for record in jobs:
        final = service.wait(record.id, timeout=90)
        assert str(final.state) == "cancelled", (final.name, final.reason, final.error)
    assert_no_job_processes(service)
