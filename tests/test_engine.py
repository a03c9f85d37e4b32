"""The local job engine with real processes and real torch.distributed (gloo on CPU)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest
from helpers import assert_no_job_processes, job_processes, run_cli, wait_for

from jupyterlab_mlcluster.jobs.model import JobSpec, JobState, RankState, SpecError
from jupyterlab_mlcluster.runtime.payload import Payload

# Every engine test runs with the warm pool on and off (`pool_mode`, tests/conftest.py).
pytestmark = pytest.mark.usefixtures("pool_mode")

ALL_REDUCE = textwrap.dedent(
    """
    import torch, torch.distributed as dist
    dist.init_process_group("gloo")
    t = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(t)
    print(t.item())
    """
)


def submit(service, source: str, **options) -> str:
    push = options.pop("push", {})
    pull = options.pop("pull", [])
    spec = JobSpec.from_options(options)
    return service.submit(spec, Payload(source=source, push=push, pull=pull)).id


@pytest.mark.slow
def test_cli_run_all_reduce(store_dir, tmp_path):
    script = tmp_path / "allreduce.py"
    script.write_text(ALL_REDUCE)
    proc = run_cli("run", "--workers", "4", str(script))
    assert proc.returncode == 0, proc.stderr
    for rank in range(4):
        assert f"[rank {rank}] 10.0" in proc.stdout.splitlines()
    listing = run_cli("jobs")
    assert listing.returncode == 0
    assert "allreduce" in listing.stdout and "succeeded" in listing.stdout


def test_rank_environment_is_torchrun_compatible(service):
    code = textwrap.dedent(
        """
        import os, json
        keys = ["RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS", "MY_FLAG"]
        print(json.dumps({k: os.environ.get(k) for k in keys}))
        """
    )
    job_id = submit(service, code, workers=3, env={"MY_FLAG": "on"})
    record = service.wait(job_id, timeout=60)
    assert record.state == JobState.SUCCEEDED, record.error
    envs = {line["rank"]: json.loads(line["line"]) for line in service.logs(job_id)[0]}
    assert sorted(envs) == [0, 1, 2]
    ports = {e["MASTER_PORT"] for e in envs.values()}
    assert len(ports) == 1 and int(ports.pop()) > 0
    for rank, env in envs.items():
        assert env["RANK"] == env["LOCAL_RANK"] == str(rank)
        assert env["WORLD_SIZE"] == env["LOCAL_WORLD_SIZE"] == "3"
        assert env["MASTER_ADDR"] == "localhost"  # as torchrun --standalone gives it
        # A pool without GPUs leaves the variable as it was (torchrun does not set it).
        assert env["CUDA_VISIBLE_DEVICES"] == os.environ.get("CUDA_VISIBLE_DEVICES")
        assert env["OMP_NUM_THREADS"] == "1"
        assert env["MY_FLAG"] == "on"


def test_gpus_are_assigned_per_rank(service, monkeypatch):
    # A pool of 4 (pretend) GPUs: CUDA_VISIBLE_DEVICES is only an assignment, so the
    # scheduling path is the same as on a GPU machine.
    monkeypatch.setenv("MLCLUSTER_GPUS", "0,1,2,3")
    from jupyterlab_mlcluster.jobs.service import JobService

    gpu_service = JobService()
    code = "import os; print(os.environ['CUDA_VISIBLE_DEVICES'])"
    job_id = submit(gpu_service, code, workers=2, gpus_per_worker=2)
    assert gpu_service.wait(job_id, timeout=60).state == JobState.SUCCEEDED
    seen = {line["rank"]: line["line"] for line in gpu_service.logs(job_id)[0]}
    assert seen == {0: "0,1", 1: "2,3"}
    with pytest.raises(SpecError, match="needs 8 GPUs .* has 4 GPUs"):
        gpu_service.submit(
            JobSpec.from_options({"workers": 4, "gpus_per_worker": 2}), Payload(source="pass")
        )


def test_framework_environments(service):
    code = "import os, json; print(json.dumps({k: os.environ.get(k) for k in ['TF_CONFIG', 'JAX_COORDINATOR_ADDRESS', 'JAX_NUM_PROCESSES', 'JAX_PROCESS_ID']}))"
    tf = submit(service, code, workers=2, framework="tensorflow")
    jax = submit(service, code, workers=2, framework="jax")
    for job_id in (tf, jax):
        assert service.wait(job_id, timeout=60).state == JobState.SUCCEEDED
    tf_env = {entry["rank"]: json.loads(entry["line"]) for entry in service.logs(tf)[0]}
    configs = {r: json.loads(e["TF_CONFIG"]) for r, e in tf_env.items()}
    assert (
        configs[0]["cluster"] == configs[1]["cluster"] and len(configs[0]["cluster"]["worker"]) == 2
    )
    assert [configs[r]["task"] for r in (0, 1)] == [
        {"type": "worker", "index": 0},
        {"type": "worker", "index": 1},
    ]
    jax_env = {entry["rank"]: json.loads(entry["line"]) for entry in service.logs(jax)[0]}
    assert jax_env[0]["JAX_COORDINATOR_ADDRESS"] == jax_env[1]["JAX_COORDINATOR_ADDRESS"]
    assert [jax_env[r]["JAX_PROCESS_ID"] for r in (0, 1)] == ["0", "1"]
    assert jax_env[1]["JAX_NUM_PROCESSES"] == "2"


def test_push_pull_and_last_expression(service):
    job_id = submit(service, "y = x * 2\nz = 'unused'", workers=2, push={"x": 21}, pull=["y"])
    assert service.wait(job_id, timeout=60).state == JobState.SUCCEEDED
    assert service.result(job_id) == ("pull", {"y": 42})
    job_id = submit(service, "import os\nint(os.environ['RANK']) + 100", workers=2)
    record = service.wait(job_id, timeout=60)
    assert record.has_result and service.result(job_id) == ("value", 100)  # rank 0's value


def test_failing_rank_fails_fast_with_its_traceback(service):
    code = textwrap.dedent(
        """
        import os, time
        def train():
            if os.environ["RANK"] == "2":
                raise ValueError("rank two is broken")
            time.sleep(120)
        train()
        """
    )
    started = time.monotonic()
    job_id = submit(service, code, workers=4)
    record = service.wait(job_id, timeout=60)
    assert time.monotonic() - started < 20, "fail-fast must not wait for the sleeping ranks"
    assert record.state == JobState.FAILED
    assert record.failed_rank == 2
    # ...; where the other ranks were when they were stopped (jobs/forensics/)
    assert record.error.startswith("rank 2 failed: ValueError: rank two is broken; rank")
    states = {r.rank: r.state for r in record.ranks}
    assert states[2] == RankState.FAILED
    assert {states[r] for r in (0, 1, 3)} == {RankState.CANCELLED}
    report = service.error_report(job_id)
    assert (
        "line 5, in train" in report["traceback"]
        and "ValueError: rank two is broken" in report["traceback"]
    )
    assert 'raise ValueError("rank two is broken")' in report["traceback"]  # source lines shown
    assert "jupyterlab_mlcluster" not in report["traceback"]  # our frames hidden
    assert_no_job_processes(service, timeout=5)


def test_killed_cli_leaves_no_ranks_and_a_final_state(store_dir, tmp_path, service):
    script = tmp_path / "sleepy.py"
    script.write_text("import time\nprint('up', flush=True)\ntime.sleep(300)\n")
    cli = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab_mlcluster.cli", "run", "--workers", "4", str(script)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        job = wait_for(
            lambda: service.store.list_jobs(states=["running"])[0],
            timeout=60,
            message="job running",
        )[0]
        wait_for(
            lambda: all(r.state == RankState.RUNNING for r in service.store.get_job(job.id).ranks),
            timeout=60,
        )
        ranks = job_processes(service, job.id)
        assert len(ranks) == 5  # supervisor + 4 ranks
        cli.send_signal(signal.SIGKILL)
        cli.wait(10)
        wait_for(lambda: not job_processes(service, job.id), timeout=20, message="ranks to go")
        listing = run_cli("jobs", "--json")
        state = {j["id"]: j for j in json.loads(listing.stdout)}[job.id]
        assert state["state"] == "cancelled"
    finally:
        cli.kill()


def test_supervisor_death_takes_ranks_with_it(service):
    job_id = submit(service, "import time\ntime.sleep(300)", workers=2)
    wait_for(
        lambda: all(r.state == RankState.RUNNING for r in service.store.get_job(job_id).ranks),
        timeout=60,
    )
    record = service.store.get_job(job_id)
    ranks = [psutil.Process(r.pid) for r in record.ranks]
    os.kill(record.supervisor["pid"], signal.SIGKILL)
    gone, alive = psutil.wait_procs(ranks, timeout=10)
    assert not alive, "ranks must die with their supervisor (PR_SET_PDEATHSIG)"
    record = wait_for(lambda: (r := service.get(job_id)).final and r, timeout=10, message="reaped")
    assert record.state == JobState.FAILED
    assert "supervisor process died" in record.error


def test_whole_pool_jobs_run_one_after_the_other(service, monkeypatch, tmp_path):
    monkeypatch.setenv("MLCLUSTER_CPU_SLOTS", "4")
    from jupyterlab_mlcluster.jobs.service import JobService

    small_pool = JobService()
    code = (
        "import time, os\nprint('start', time.time())\ntime.sleep(1.5)\nprint('end', time.time())"
    )
    first = submit(small_pool, code, workers=4, name="first")
    second = submit(small_pool, code, workers=4, name="second")
    wait_for(lambda: small_pool.store.get_job(first).state == JobState.RUNNING, timeout=60)
    queued = small_pool.store.get_job(second)
    assert queued.state == JobState.QUEUED and queued.queue_position == 0
    assert all(r.state == RankState.PENDING for r in queued.ranks)
    # (while the first job is still being admitted the reason may say "queued behind 1 job")
    wait_for(
        lambda: "CPU slots" in (small_pool.store.get_job(second).reason or ""),
        timeout=5,
        message="the wait reason",
    )
    assert small_pool.store.get_job(second).reason == "waiting for 4 CPU slots (0 free)"
    for job_id in (first, second):
        assert small_pool.wait(job_id, timeout=120).state == JobState.SUCCEEDED

    def span(job_id):
        times = {}
        for line in small_pool.logs(job_id)[0]:
            kind, ts = line["line"].split()
            times.setdefault(kind, []).append(float(ts))
        return min(times["start"]), max(times["end"])

    (_, e1), (s2, _) = span(first), span(second)
    assert e1 <= s2, "the second job's ranks started before the first job's had ended"


def test_priority_orders_the_queue(service, monkeypatch):
    monkeypatch.setenv("MLCLUSTER_CPU_SLOTS", "2")
    from jupyterlab_mlcluster.jobs.service import JobService

    svc = JobService()
    blocker = submit(svc, "import time; time.sleep(2)", workers=2)
    wait_for(lambda: svc.store.get_job(blocker).state == JobState.RUNNING, timeout=60)
    low = submit(svc, "import time; print(time.time())", workers=2, priority=0)
    high = submit(svc, "import time; print(time.time())", workers=2, priority=5)
    assert svc.store.queue("local") == [high, low]
    for job_id in (blocker, low, high):
        assert svc.wait(job_id, timeout=120).state == JobState.SUCCEEDED
    assert svc.store.get_job(high).started < svc.store.get_job(low).started


@pytest.mark.parametrize(
    "options,message",
    [
        ({"workers": 100}, "needs 100 CPU slots"),
        ({"workers": 2, "gpus_per_worker": 1}, "needs 2 GPUs .* no GPUs"),
        ({"workers": 1, "memory": "1Ei"}, "of memory"),
        ({"workers": 1, "image": "python:3.11"}, "--image only applies to the kubernetes backend"),
    ],
)
def test_impossible_requests_are_refused_and_nothing_is_stored(service, options, message):
    with pytest.raises(SpecError, match=message):
        service.submit(JobSpec.from_options(options), Payload(source="pass"))
    assert service.store.list_jobs()[1] == 0


@pytest.mark.slow
def test_cli_refuses_bad_options_without_submitting(store_dir, tmp_path):
    script = tmp_path / "s.py"
    script.write_text("pass")
    for args, message in [
        (["--workers", "0"], "workers must be at least 1"),
        (["--memory", "lots"], "memory must be a size"),
        (["--timeout", "soon"], "timeout must be a duration"),
    ]:
        proc = run_cli("run", *args, str(script))
        assert proc.returncode == 2 and message in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr
    proc = run_cli("run", "--workers", "2", str(tmp_path / "missing.py"))
    assert proc.returncode == 2 and "no such script" in proc.stderr
    assert json.loads(run_cli("jobs", "--json").stdout) == []


def test_max_restarts_restarts_the_whole_gang(service):
    code = textwrap.dedent(
        """
        import os
        attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
        print("attempt", attempt)
        if attempt == 0 and os.environ["RANK"] == "1":
            raise RuntimeError("flaky")
        """
    )
    job_id = submit(service, code, workers=2, max_restarts=2)
    record = service.wait(job_id, timeout=60)
    assert record.state == JobState.SUCCEEDED, record.error
    assert record.restarts == 1
    lines = [
        entry["line"] for entry in service.logs(job_id, rank=1)[0]
    ]  # rank 0 may be stopped before it prints
    assert lines[0] == "attempt 0" and "attempt 1" in lines
    assert any("restarting all ranks (restart 1 of 2)" in entry for entry in lines)
    # Without restarts left the job fails
    job_id = submit(service, "raise RuntimeError('always')", workers=2, max_restarts=1)
    record = service.wait(job_id, timeout=60)
    assert record.state == JobState.FAILED and record.restarts == 1


def test_timeout_fails_and_stops_the_job(service):
    job_id = submit(service, "import time\ntime.sleep(300)", workers=2, timeout="2s")
    record = service.wait(job_id, timeout=60)
    assert record.state == JobState.FAILED
    assert record.error.startswith("timed out after 2s; rank")  # ...; where they were
    assert_no_job_processes(service, timeout=5)


def test_cancel_from_another_process_and_purge(service, store_dir):
    job_id = submit(
        service, "import time\nprint('working', flush=True)\ntime.sleep(300)", workers=2
    )
    wait_for(lambda: service.logs(job_id)[0], timeout=60, message="output")
    proc = run_cli("cancel", job_id)
    assert proc.returncode == 0 and "cancelled" in proc.stdout
    record = service.get(job_id)
    # the reason names what stopped the job
    assert record.state == JobState.CANCELLED
    assert record.reason.startswith("cancelled by user (mlcluster cancel); ranks 0, 1 were in ")
    assert {r.state for r in record.ranks} == {RankState.CANCELLED}
    assert_no_job_processes(service, timeout=5)
    assert run_cli("logs", job_id).stdout.startswith("[rank")  # logs survive the cancel
    assert run_cli("cancel", job_id, "--purge").returncode == 0
    assert not service.store.job_dir(job_id).exists()
    assert run_cli("logs", job_id).returncode == 2


def test_logs_follow_and_rank_filter(service, store_dir):
    job_id = submit(
        service,
        "import os, time\nfor i in range(3):\n    print(os.environ['RANK'], i, flush=True)\n    time.sleep(0.3)",
        workers=2,
    )
    proc = run_cli("logs", job_id, "--follow", "--rank", "1", timeout=60)
    assert proc.stdout.splitlines() == ["[rank 1] 1 0", "[rank 1] 1 1", "[rank 1] 1 2"]


@pytest.mark.slow
def test_jobs_survive_the_submitting_process(store_dir, tmp_path):
    script = tmp_path / "quick.py"
    script.write_text("print('hi')")
    proc = run_cli("run", "--no-wait", "--workers", "2", str(script))
    assert proc.returncode == 0
    job_id = proc.stdout.strip()
    from jupyterlab_mlcluster.jobs.service import JobService

    fresh = JobService()  # another process's view of the same store
    assert fresh.wait(job_id, timeout=60).state == JobState.SUCCEEDED
    assert [entry["line"] for entry in fresh.logs(job_id)[0]] == ["hi", "hi"]


def test_stdout_and_stderr_are_kept_apart_with_timestamps(service):
    job_id = submit(service, "import sys\nprint('out')\nprint('err', file=sys.stderr)", workers=1)
    assert service.wait(job_id, timeout=60).state == JobState.SUCCEEDED
    lines = service.logs(job_id)[0]
    assert {(entry["stream"], entry["line"]) for entry in lines} == {
        ("stdout", "out"),
        ("stderr", "err"),
    }
    assert all(entry["ts"].endswith("Z") for entry in lines)


@pytest.mark.slow
def test_the_submitters_settings_govern_its_job(store_dir):
    """A server's c.MLClusterConfig (not in any config file) reaches the job's supervisor:
    here a short kill grace period for a rank that ignores SIGTERM."""
    from jupyterlab_mlcluster.config import MLClusterConfig
    from jupyterlab_mlcluster.jobs.service import JobService

    svc = JobService(config=MLClusterConfig(kill_grace_period=0.3))
    code = "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint('stubborn', flush=True)\ntime.sleep(300)"
    job_id = submit(svc, code, workers=1)
    wait_for(lambda: svc.logs(job_id)[0], timeout=60, message="the rank to start")
    started = time.monotonic()
    record = svc.cancel(job_id)
    assert record.state == JobState.CANCELLED
    assert time.monotonic() - started < 2.5, "the default 30 s grace period was used"
    assert record.reason.startswith(  # ...; where it was (jobs/forensics/)
        "cancelled by user; rank 0 had not exited 0.3 s after SIGTERM and was killed; rank 0 was in "
    )
    assert_no_job_processes(svc, timeout=5)


def test_a_store_of_an_older_version_is_migrated(tmp_path):
    """ranks.pgid always held the rank's process start time; it is now named for that,
    and a store written before the rename keeps its rows (opened twice: idempotent). A jobs
    table from before the idle-GPU flag gets its column, its jobs unflagged."""
    import sqlite3

    from jupyterlab_mlcluster.jobs.storage.store import SCHEMA, JobStore

    root = tmp_path / "old-store"
    root.mkdir()
    old = sqlite3.connect(root / "jobs.db")
    jobs_before_idle_flag = SCHEMA.split(";")[0].replace("gpu_idle_since REAL,", "")
    assert "gpu_idle_since" not in jobs_before_idle_flag
    old.executescript(
        jobs_before_idle_flag
        + """;
        INSERT INTO jobs (id, name, state, backend, spec, created, updated)
            VALUES ('jold000001', 'old', 'running', 'local', '{}', 1.0, 1.0);
        CREATE TABLE ranks (job_id TEXT NOT NULL, rank INTEGER NOT NULL, state TEXT NOT NULL,
        exit_code INTEGER, pid INTEGER, pgid INTEGER, host TEXT, started REAL, finished REAL,
        metrics TEXT NOT NULL DEFAULT '{}', progress TEXT, PRIMARY KEY (job_id, rank));
        INSERT INTO ranks (job_id, rank, state, pid, pgid) VALUES ('jold000001', 0, 'running', 4242, 1700000000.25);"""
    )
    old.commit()
    old.close()
    for _ in range(2):
        store = JobStore(root)
        check = sqlite3.connect(root / "jobs.db")
        columns = {row[1] for row in check.execute("PRAGMA table_info(ranks)")}
        check.close()
        assert "process_start" in columns and "pgid" not in columns
        assert store.rank_processes("jold000001") == [(0, 4242, 1700000000.25)]
        assert store.get_job("jold000001").gpu_idle_since is None
        store.close()
