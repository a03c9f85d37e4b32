"""Spares: a job's supervisor and ranks forked from the zygote before the job comes
(jobs/warm/spares.py). A rank made of a spare is still a fresh worker in every way the job can
see, and spares never outlive their pool nor a job that did not need them."""

from __future__ import annotations

import json
import os
import signal
import textwrap

import psutil
import pytest
from helpers import process_gone, run_cli, wait_for

from jupyterlab_mlcluster.jobs import warm
from jupyterlab_mlcluster.jobs.model import JobSpec, JobState
from jupyterlab_mlcluster.runtime.payload import Payload

# What a rank can see of where and when it was made: its environment (the job's, the rank's
# variables), cwd, sys.path, argv and parent.
PROBE = textwrap.dedent(
    """
    import json, os, sys
    print(json.dumps({
        "pid": os.getpid(),
        "ppid": os.getppid(),
        "env": {k: v for k, v in os.environ.items() if not k.startswith("MLCLUSTER_")
                and k not in ("TORCHELASTIC_ERROR_FILE", "TORCHELASTIC_RUN_ID", "MASTER_PORT")},
        "cwd": os.getcwd(),
        "path0": sys.path[0],
        "argv": sys.argv,
    }))
    """
)


def run(service, workers: int, code: str = PROBE) -> dict[int, dict]:
    record = service.submit(JobSpec.from_options({"workers": workers}), Payload(source=code))
    record = service.wait(record.id, timeout=120)
    assert record.state == JobState.SUCCEEDED, record.error
    out = {}
    for line in service.logs(record.id)[0]:
        if line["line"].startswith("{"):
            out[line["rank"]] = json.loads(line["line"])
    assert sorted(out) == list(range(workers))
    return out


def spare_tree(config) -> tuple[int | None, list[int]]:
    """The pool's spare supervisor and its spare ranks (None, []: none is ready)."""
    status = warm.status(config) or {}
    ping = warm.request(warm.socket_path(status["fingerprint"]), {"op": "ping"})
    if not ping.get("spare"):
        return None, []
    try:
        return ping["spare"], [p.pid for p in psutil.Process(ping["spare"]).children()]
    except psutil.Error:
        return None, []


def spares_ready(config, ranks: int) -> bool:
    return len(spare_tree(config)[1]) == ranks


@pytest.fixture
def pool(service, monkeypatch):
    monkeypatch.setenv("MLCLUSTER_WARM_POOL", "1")
    yield service
    warm.stop(service.config)


def test_a_job_is_served_by_spares_and_sees_its_own_environment_as_a_cold_one(
    pool, monkeypatch, tmp_path
):
    """The spares were forked before the job's variables, cwd or size were known; the job's
    ranks are those spares, and see what cold ranks of the same job see."""
    run(pool, workers=3)  # the pool learns the job's size: its next spares are 3 ranks
    wait_for(lambda: spares_ready(pool.config, 3), timeout=30, message="3 spare ranks")
    supervisor, ranks = spare_tree(pool.config)

    workdir = tmp_path / "here"
    workdir.mkdir()
    monkeypatch.chdir(workdir)
    monkeypatch.setenv("MLC_SPARE_PROBE", "set after the spares were forked")
    monkeypatch.delenv("MLC_SPARE_GONE", raising=False)
    warm_out = run(pool, workers=3)
    assert sorted(o["pid"] for o in warm_out.values()) == sorted(ranks), "not served by spares"
    assert {o["ppid"] for o in warm_out.values()} == {supervisor}

    monkeypatch.setenv("MLCLUSTER_WARM_POOL", "0")
    cold_out = run(pool, workers=3)
    for rank in range(3):
        warm_rank, cold_rank = warm_out[rank], cold_out[rank]
        assert warm_rank["env"]["MLC_SPARE_PROBE"] == "set after the spares were forked"
        assert warm_rank["env"]["RANK"] == str(rank) and warm_rank["env"]["WORLD_SIZE"] == "3"
        assert warm_rank["env"] == cold_rank["env"]
        assert warm_rank["cwd"] == cold_rank["cwd"] == str(workdir)
        assert warm_rank["path0"] == cold_rank["path0"]
        assert warm_rank["argv"] == cold_rank["argv"]


def test_spares_a_job_does_not_need_are_reaped_and_all_die_with_the_pool(pool):
    run(pool, workers=3)
    wait_for(lambda: spares_ready(pool.config, 3), timeout=30, message="3 spare ranks")
    supervisor, ranks = spare_tree(pool.config)
    out = run(pool, workers=1)  # one of the three serves; the two others are not left behind
    assert out[0]["pid"] in ranks
    for pid in [supervisor, *ranks]:
        wait_for(lambda pid=pid: process_gone(pid), timeout=10, message=f"spare {pid} to go")

    # The next spares match the last job (1 rank); the memory they take is the pool's.
    wait_for(lambda: spares_ready(pool.config, 1), timeout=30, message="1 spare rank")
    status = warm.status(pool.config)
    assert status["spare_ranks"] == 1
    zygote_alone = psutil.Process(status["pid"]).memory_full_info().pss
    assert status["pss_bytes"] > zygote_alone
    out = run_cli("pool", "status").stdout
    assert "with its spare supervisor and 1 spare rank(s)" in out, out

    # kill -9 of the zygote: its spares see their pipe's end and exit, nobody else needed.
    supervisor, ranks = spare_tree(pool.config)
    os.kill(status["pid"], signal.SIGKILL)
    for pid in [supervisor, *ranks]:
        wait_for(lambda pid=pid: process_gone(pid), timeout=5, message=f"spare {pid} to go")


def test_stopping_the_pool_ends_its_spares(pool):
    run(pool, workers=2)
    wait_for(lambda: spares_ready(pool.config, 2), timeout=30, message="2 spare ranks")
    supervisor, ranks = spare_tree(pool.config)
    warm.stop(pool.config)
    for pid in [supervisor, *ranks]:
        wait_for(lambda pid=pid: process_gone(pid), timeout=5, message=f"spare {pid} to go")
