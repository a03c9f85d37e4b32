"""The slurm backend against a real one-node Slurm (conftest.py: munged, slurmctld, slurmd).

Each test leaves nothing in squeue (the `slurm_store` fixture checks it). The node has 2
CPUs: a 2-rank job fills it, so a second one must wait in Slurm's queue.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import textwrap
import time

import pytest
from helpers import run_cli, wait_for

from jupyterlab_mlcluster.backends.slurm.script import ACTIVE_STATES
from jupyterlab_mlcluster.jobs.model import JobSpec, JobState, SpecError
from jupyterlab_mlcluster.runtime.payload import Payload

ALL_REDUCE = textwrap.dedent(
    """
    import os, torch, torch.distributed as dist
    dist.init_process_group("gloo")
    t = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(t)
    print(f"sum={t.item()} rank={dist.get_rank()} slurm_job={os.environ['SLURM_JOB_ID']}", flush=True)
    dist.destroy_process_group()
    """
)


def submit(service, source: str, **options):
    push = options.pop("push", {})
    pull = options.pop("pull", [])
    spec = JobSpec.from_options({"backend": "slurm", **options})
    return service.submit(spec, Payload(source=source, push=push, pull=pull))


@pytest.fixture
def service(slurm_store):
    from jupyterlab_mlcluster.jobs.service import JobService

    svc = JobService()
    yield svc
    for record in svc.store.list_jobs()[0]:
        if not record.final:
            svc.cancel(record.id)


def test_cli_runs_a_two_rank_gloo_job_in_one_srun_step(slurm_store, slurm, tmp_path):
    script = tmp_path / "allreduce.py"
    script.write_text(ALL_REDUCE)
    proc = run_cli("run", "--backend", "slurm", "--workers", "2", "--name", "ar", str(script))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    found = [dict(re.findall(r"(\w+)=(\S+)", line)) for line in proc.stdout.splitlines()]
    found = [f for f in found if "sum" in f]
    assert sorted(f["rank"] for f in found) == ["0", "1"], proc.stdout
    assert all(f["sum"] == "3.0" for f in found)
    assert len({f["slurm_job"] for f in found}) == 1  # both ranks in the same allocation
    listing = run_cli("jobs")
    assert "ar" in listing.stdout and "succeeded" in listing.stdout


def test_cli_with_a_supervisor_forked_from_the_warm_pool(slurm_store, tmp_path):
    """The default set-up: the job's supervisor is forked from the warm pool's zygote (which
    gets the submitter's environment, SLURM_CONF with it), and talks to the same Slurm."""
    script = tmp_path / "hello.py"
    script.write_text(
        "import os\nprint('rank', os.environ['RANK'], 'of', os.environ['SLURM_JOB_ID'])\n"
    )
    env = dict(os.environ, MLCLUSTER_WARM_POOL="1")
    proc = run_cli("run", "--backend", "slurm", "--workers", "2", str(script), env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    found = sorted(re.findall(r"rank (\d) of (\d+)", proc.stdout))
    assert [r for r, _ in found] == ["0", "1"] and found[0][1] == found[1][1], proc.stdout


def test_ranks_get_the_torchrun_environment_from_slurms(service, slurm):
    code = textwrap.dedent(
        """
        import os, json
        keys = ["RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "OMP_NUM_THREADS",
                "SLURM_PROCID", "MY_FLAG"]
        print(json.dumps({k: os.environ.get(k) for k in keys}))
        """
    )
    job = submit(service, code, workers=2, env={"MY_FLAG": "on"})
    record = service.wait(job.id, timeout=60)
    assert record.state == JobState.SUCCEEDED, record.error
    envs = {line["rank"]: json.loads(line["line"]) for line in service.logs(job.id)[0]}
    assert sorted(envs) == [0, 1]
    assert len({e["MASTER_PORT"] for e in envs.values()}) == 1
    for rank, env in envs.items():
        assert env["RANK"] == env["LOCAL_RANK"] == env["SLURM_PROCID"] == str(rank)
        assert env["WORLD_SIZE"] == env["LOCAL_WORLD_SIZE"] == "2"
        assert env["GROUP_RANK"] == "0"
        assert env["MASTER_ADDR"] == slurm.node
        assert env["TORCHELASTIC_RUN_ID"] == job.id
        assert env["OMP_NUM_THREADS"] == "1" and env["MY_FLAG"] == "on"
    assert [r.state for r in record.ranks] == ["succeeded", "succeeded"]


def rank_lines(service, job_id: str, rank: int | None = None, stream: str | None = None):
    """What the ranks printed (stdout and stderr), or one stream ("system": mlcluster's)."""
    return [
        line["line"]
        for line in service.logs(job_id, rank=rank)[0]
        if (line["stream"] == stream if stream else line["stream"] != "system")
    ]


def test_a_failing_rank_stops_the_other_and_its_traceback_is_the_error(service):
    code = textwrap.dedent(
        """
        import os, time
        def check(value):
            raise ValueError(f"bad value {value}")
        if os.environ["RANK"] == "1":
            time.sleep(0.5)
            check(42)
        print("rank 0 waits", flush=True)
        time.sleep(120)
        """
    )
    job = submit(service, code, workers=2)
    record = service.wait(job.id, timeout=90)
    assert record.state == JobState.FAILED
    assert record.failed_rank == 1
    # Where the rank still alive was, read before it was stopped (issue 33).
    assert record.error == (
        "rank 1 failed: ValueError: bad value 42; "
        "rank 0 was still in <module> (cell.py:9): time.sleep(120)"
    )
    report = service.error_report(job.id)
    assert "check(42)" in report["traceback"] and "ValueError: bad value 42" in report["traceback"]
    states = {r.rank: r.state for r in record.ranks}
    assert states == {0: "cancelled", 1: "failed"}
    assert any("ValueError: bad value 42" in line for line in rank_lines(service, job.id, 1))
    assert record.finished - record.started < 60  # rank 0 did not sleep its 120 s


def test_cancel_sends_sigterm_then_the_allocation_goes(service, slurm):
    code = textwrap.dedent(
        """
        import signal, sys, time
        def bye(signum, frame):
            print("SIGTERM handled", flush=True)
            sys.exit(0)
        signal.signal(signal.SIGTERM, bye)
        print("ready", flush=True)
        time.sleep(120)
        """
    )
    job = submit(service, code, workers=2)
    wait_for(lambda: len(rank_lines(service, job.id)) == 2, 60, message="both ranks ready")
    record = service.cancel(job.id)
    assert record.state == JobState.CANCELLED
    # Where the ranks were, read before they were stopped (issue 33).
    assert record.reason == (
        "cancelled by user; ranks 0, 1 were in <module> (cell.py:8): time.sleep(120)"
    )
    assert rank_lines(service, job.id).count("SIGTERM handled") == 2
    assert (
        rank_lines(service, job.id, stream="system")
        == ["[mlcluster] stopping (cancelled by user): SIGTERM, then SIGKILL after 3 s"] * 2
    )
    assert {r.state for r in record.ranks} == {"cancelled"}
    assert slurm.jobs() == []


def test_a_timeout_ends_the_job_with_its_reason(service):
    job = submit(
        service,
        "import time\nprint('start', flush=True)\ntime.sleep(120)\n",
        workers=1,
        timeout="3s",
    )
    record = service.wait(job.id, timeout=90)
    assert record.state == JobState.FAILED
    assert (
        record.error
        == record.reason
        == ("timed out after 3s; rank 0 was in <module> (cell.py:3): time.sleep(120)")
    )
    lines = rank_lines(service, job.id)
    assert lines[0] == "start"
    # What Slurm itself said on the rank's stderr is in its log too.
    assert all("CANCELLED" in line for line in lines[1:])


def test_a_job_waits_behind_another_with_slurms_reason_then_runs(service, tmp_path):
    release = tmp_path / "release"
    first = submit(
        service,
        f"import os, time\nwhile not os.path.exists({str(release)!r}):\n    time.sleep(0.1)\n",
        workers=2,  # the node's 2 CPUs
    )
    wait_for(lambda: service.get(first.id).state == JobState.RUNNING, 60, message="first runs")
    second = submit(service, "print('second ran')", workers=2)
    waiting = wait_for(
        lambda: (r := service.get(second.id)).reason and "Resources" in r.reason and r,
        60,
        message="Slurm's pending reason",
    )
    assert waiting.state == JobState.QUEUED
    assert waiting.reason.startswith("waiting in Slurm: Resources")
    assert "position 1 in Slurm's queue" in waiting.reason
    listing = run_cli("jobs")
    assert "Resources" in listing.stdout
    release.write_text("go")
    assert service.wait(first.id, timeout=60).state == JobState.SUCCEEDED
    record = service.wait(second.id, timeout=60)
    assert record.state == JobState.SUCCEEDED and record.reason is None
    assert rank_lines(service, second.id) == ["second ran", "second ran"]


def test_the_reaper_cancels_the_allocation_of_a_killed_supervisor(service, slurm):
    job = submit(service, "import time\nprint('up', flush=True)\ntime.sleep(300)\n", workers=1)
    wait_for(lambda: rank_lines(service, job.id) == ["up"], 60, message="the rank runs")
    assert len(slurm.jobs()) == 1
    pid = service.get(job.id).supervisor["pid"]
    os.kill(pid, signal.SIGKILL)
    wait_for(
        lambda: service.reap(force=True) == [job.id] or service.get(job.id).final,
        30,
        message="the reaper settles the job",
    )
    record = service.get(job.id)
    assert record.state == JobState.FAILED and "supervisor" in record.error
    slurm.wait_empty(30)  # the reaper cancelled it; nothing else would have
    # Its cleanup is done once Slurm has nothing of the job left: no longer pending.
    wait_for(
        lambda: (
            not service.reap(force=True)
            and "pending_cleanup" not in service.get(job.id).backend_state
        ),
        30,
        message="the cleanup to be done",
    )


def test_a_sweep_of_three_trials_two_at_a_time(slurm_store, slurm, tmp_path):
    from jupyterlab_mlcluster.jobs.service import JobService

    script = tmp_path / "trial.py"
    script.write_text(
        "import os, sys, time\n"
        "print('lr', sys.argv[1], 'slurm job', os.environ['SLURM_JOB_ID'], time.time())\n"
        "time.sleep(1)\n"
    )
    result = run_cli(
        "run",
        "--backend",
        "slurm",
        "--framework",
        "none",
        "--sweep",
        "lr=1,2,3",
        "--parallel",
        "2",
        str(script),
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "3 succeeded" in result.stdout
    service = JobService()
    jobs, _ = service.store.list_jobs(newest_first=False)
    assert len(jobs) == 3 and {j.backend for j in jobs} == {"slurm"}
    lines = [rank_lines(service, j.id) for j in jobs]
    assert sorted(line.split()[1] for (line,) in lines) == ["--lr=1", "--lr=2", "--lr=3"]
    assert len({line.split()[4] for (line,) in lines}) == 3  # one Slurm job per trial
    spans = [(j.started, j.finished) for j in jobs]
    # Never three at once: the third started only after one of the first two finished.
    third = max(spans)
    assert sum(1 for s in spans if s[0] < third[0] and s[1] > third[0]) <= 1


def test_a_scheduled_run_goes_to_slurm(service, tmp_path):
    from jupyterlab_mlcluster.jobs.experiments.scheduler import Scheduler, create_schedule

    path = tmp_path / "nightly.py"
    path.write_text("print('nightly ran')\n")
    create_schedule(
        service,
        spec=JobSpec.from_options({"backend": "slurm", "workers": 2}),
        payload=Payload(kind="script", filename=str(path)),
        options={"name": "nightly", "cron": "0 * * * *"},
        owner="alice",
        origin={"kind": "test"},
        now=1_000_000_000.0,
    )
    (fired,) = Scheduler(service).fire_due(now=1_000_000_000.0 - 400 + 3600 + 5)
    assert fired["outcome"] == "submitted"
    record = service.wait(fired["job_id"], timeout=60)
    assert record.state == JobState.SUCCEEDED and record.backend == "slurm"
    assert rank_lines(service, record.id) == ["nightly ran", "nightly ran"]


@pytest.mark.parametrize(
    "options, words",
    [
        ({"queue": "nope"}, "invalid partition specified: nope"),
        ({"gpus_per_worker": 1}, "Invalid generic resource (gres) specification"),
        ({"workers": 3}, "Requested node configuration is not available"),
        ({"memory": "4Gi"}, "Requested node configuration is not available"),  # 1000 MB node
    ],
)
def test_what_slurm_refuses_is_refused_in_its_words_before_anything_is_stored(
    service, options, words
):
    with pytest.raises(SpecError) as refused:
        submit(service, "print(1)", **options)
    assert words in str(refused.value) and str(refused.value).startswith("Slurm refuses the job")
    assert service.store.list_jobs()[1] == 0


def test_without_sbatch_the_error_says_so_and_nothing_is_stored(slurm_store, tmp_path):
    (tmp_path / "jupyter-config" / "jupyter_mlcluster_config.json").write_text(
        json.dumps({"MLClusterConfig": {"slurm_bin_dir": str(tmp_path)}})
    )
    script = tmp_path / "x.py"
    script.write_text("print(1)\n")
    proc = run_cli("run", "--backend", "slurm", str(script))
    assert proc.returncode != 0
    assert f"sbatch not found in {tmp_path}" in proc.stderr
    listing = run_cli("jobs", "--json")
    assert json.loads(listing.stdout) == []
    # GET /cluster cannot tell: unknown, not zero.
    from jupyterlab_mlcluster.jobs.service import JobService

    view = JobService().cluster()
    assert view["capacity"]["cpus"] == {"total": None, "free": None}
    assert view["partitions"] == []


def test_cluster_capacity_comes_from_sinfo(service, slurm, tmp_path):
    view = service.cluster()
    assert view["backend"] == "slurm"
    assert view["capacity"]["cpus"] == {"total": 2, "free": 2}
    assert view["capacity"]["gpus"] == {"total": 0, "free": 0}
    assert view["partitions"] == [
        {
            "name": "debug",
            "default": True,
            "nodes": 1,
            "cpus": {"total": 2, "free": 2},
            "gpus": {"total": 0, "free": 0},
        },
        {
            "name": "urgent",
            "default": False,
            "nodes": 1,
            "cpus": {"total": 2, "free": 2},
            "gpus": {"total": 0, "free": 0},
        },
    ]
    release = tmp_path / "release"
    job = submit(
        service,
        f"import os, time\nwhile not os.path.exists({str(release)!r}):\n    time.sleep(0.1)\n",
        workers=1,
    )
    wait_for(lambda: service.get(job.id).state == JobState.RUNNING, 60, message="it runs")
    # sinfo's answer is kept a second: the view follows within that.
    busy = wait_for(
        lambda: (c := service.cluster()["capacity"])["cpus"]["free"] == 1 and c,
        30,
        message="sinfo to count the job's CPU",
    )
    assert busy["cpus"] == {"total": 2, "free": 1}
    assert busy["memory"] == {"total": 1000 << 20, "free": 900 << 20}  # DefMemPerCPU=100
    release.write_text("go")
    assert service.wait(job.id, timeout=60).state == JobState.SUCCEEDED


MAGIC_CELL = """%%distributed --backend slurm --workers 2 --push x --pull y
import os, torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
print("sum", t.item(), "in", os.environ["SLURM_JOB_ID"])
y = t.item() * x
"""


def test_the_magic_runs_the_cell_on_slurm_with_push_and_pull(slurm_store, slurm):
    from helpers import start_kernel
    from kernel_session import KernelSession, outputs, rank_texts

    km, kc = start_kernel(kernel_name="python3", env=dict(os.environ))
    try:
        kernel = KernelSession(km, kc)
        kernel.execute("x = 3")
        msgs, reply = kernel.execute(MAGIC_CELL)
        assert reply["status"] == "ok", reply
        texts = rank_texts(msgs)
        assert sorted(texts) == [0, 1]
        assert all(re.fullmatch(rf"\[rank {r}\] sum 3\.0 in \d+", texts[r]) for r in texts)
        msgs, _ = kernel.execute("y")
        assert outputs(msgs, "execute_result")[0]["data"]["text/plain"] == "9.0"
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


async def test_rest_submits_to_slurm_and_reads_logs_result_and_capacity(slurm_store, api):
    code = "import os\nprint('rank', os.environ['RANK'], 'of', os.environ['WORLD_SIZE'])\nanswer = 42\n"
    status, job, _ = await api(
        "POST", "jobs", body={"code": code, "workers": 2, "backend": "slurm", "pull": ["answer"]}
    )
    assert status == 201, job
    assert job["backend"] == "slurm"
    deadline = time.monotonic() + 90
    while job["state"] not in ("succeeded", "failed", "cancelled"):
        assert time.monotonic() < deadline, job
        await asyncio.sleep(0.2)
        _, job, _ = await api("GET", "jobs", job["id"])
    assert job["state"] == "succeeded", job["error"]
    _, page, _ = await api("GET", "jobs", job["id"], "logs")
    assert sorted((entry["rank"], entry["line"]) for entry in page["lines"]) == [
        (0, "rank 0 of 2"),
        (1, "rank 1 of 2"),
    ]
    status, result, _ = await api("GET", "jobs", job["id"], "result")
    assert status == 200 and result == {"kind": "pull", "value": {"answer": 42}}
    status, cluster, _ = await api("GET", "cluster")
    assert status == 200 and cluster["backend"] == "slurm"
    assert cluster["partitions"][0]["name"] == "debug"
    assert cluster["capacity"]["cpus"]["total"] == 2
    status, error, _ = await api(
        "POST", "jobs", body={"code": "pass", "backend": "slurm", "queue": "nope"}
    )
    assert status == 409 and "invalid partition specified: nope" in error["message"]


def test_a_node_failure_ends_the_job_saying_so(service, slurm):
    job = submit(service, "import time\nprint('up', flush=True)\ntime.sleep(300)\n", workers=1)
    wait_for(lambda: rank_lines(service, job.id) == ["up"], 60, message="the rank runs")
    node = f"nodename={slurm.node}"
    try:
        slurm.run("scontrol", "update", node, "state=down", "reason=mlcluster-test")
        record = service.wait(job.id, timeout=60)
    finally:
        # (ReturnToService may have brought it back already: then resume is refused.)
        slurm.run("scontrol", "update", node, "state=resume", check=False)
        wait_for(slurm.idle, 30, message="the node back")
    assert record.state == JobState.FAILED
    assert record.error == "a node of the allocation failed (Slurm: NODE_FAIL)"
    assert record.ranks[0].state == "cancelled"


def test_preemption_ends_the_job_saying_so(service, slurm):
    job = submit(service, "import time\nprint('up', flush=True)\ntime.sleep(300)\n", workers=2)
    wait_for(lambda: rank_lines(service, job.id) == ["up", "up"], 60, message="the ranks run")
    urgent = submit(service, "print('urgent ran')", workers=2, queue="urgent")
    record = service.wait(job.id, timeout=60)
    assert record.state == JobState.FAILED
    assert record.error == "Slurm preempted the job (PREEMPTED)"
    assert service.wait(urgent.id, timeout=60).state == JobState.SUCCEEDED


def test_a_controller_that_does_not_answer_is_retried_a_few_times_then_refused(slurm):
    from jupyterlab_mlcluster.backends.slurm.commands import MAX_TRIES, SlurmCommands, SlurmError

    commands = SlurmCommands(timeout=1.0)
    os.kill(slurm.pid("slurmctld"), signal.SIGSTOP)  # alive, listening, answering nothing
    try:
        started = time.monotonic()
        with pytest.raises(SlurmError, match="squeue did not answer within 1 s"):
            commands.jobs(user="root")
        elapsed = time.monotonic() - started
    finally:
        os.kill(slurm.pid("slurmctld"), signal.SIGCONT)
    # MAX_TRIES calls of 1 s, with jittered waits between them (equal jitter: at least half
    # of 0.5 s, 1 s, 2 s), then the error, not forever.
    assert MAX_TRIES + 0.25 + 0.5 + 1.0 <= elapsed < MAX_TRIES + 0.5 + 1 + 2 + 5
    # It answers again (ended jobs it still remembers, nothing active).
    assert not [r for r in commands.jobs(user="root") if r["state"] in ACTIVE_STATES]


def test_a_job_carries_on_while_the_controller_stalls(service, slurm, tmp_path):
    """squeue hangs on a stopped slurmctld; the ranks' output and exits still arrive (their
    files), so the job ends when its ranks do, and its allocation goes once Slurm answers."""
    release = tmp_path / "release"
    job = submit(
        service,
        "import os, time\nprint('waiting', flush=True)\n"
        f"while not os.path.exists({str(release)!r}):\n    time.sleep(0.1)\nprint('done')\n",
        workers=2,
    )
    wait_for(lambda: rank_lines(service, job.id) == ["waiting"] * 2, 60, message="ranks run")
    os.kill(slurm.pid("slurmctld"), signal.SIGSTOP)
    try:
        release.write_text("go")
        record = service.wait(job.id, timeout=60)
        assert record.state == JobState.SUCCEEDED, record.error
        assert rank_lines(service, job.id) == ["waiting", "waiting", "done", "done"]
    finally:
        os.kill(slurm.pid("slurmctld"), signal.SIGCONT)
    slurm.wait_empty(60)


def test_a_restart_is_a_new_allocation(service):
    code = textwrap.dedent(
        """
        import os
        attempt = os.environ["TORCHELASTIC_RESTART_COUNT"]
        print("attempt", attempt, "slurm job", os.environ["SLURM_JOB_ID"], flush=True)
        if attempt == "0" and os.environ["RANK"] == "1":
            raise RuntimeError("first attempt fails")
        """
    )
    job = submit(service, code, workers=2, max_restarts=1)
    record = service.wait(job.id, timeout=90)
    assert record.state == JobState.SUCCEEDED and record.restarts == 1, record.error
    # Rank 1's log: it printed before failing (rank 0 may be stopped before it printed).
    lines = [line.split() for line in rank_lines(service, job.id, 1) if line.startswith("attempt")]
    assert [words[1] for words in lines] == ["0", "1"]
    assert lines[0][4] != lines[1][4]  # another Slurm job


def test_attack_forged_result_records_in_slurm_task_output(service, tmp_path):
    """The ranks' output files on the shared filesystem carry text only: the forgeries of
    tests/attacks.py (a marker mid-line, a made-up MAC, another job's key, the job's key
    mid-line, rank 1 posing as rank 0) load nothing and show no progress."""
    from attacks import FORGING_CELL, assert_forgeries_refused, evil_result

    mark = tmp_path / "unpickled"
    job = submit(service, FORGING_CELL, workers=2, push={"evil": evil_result(mark)})
    final = service.wait(job.id, timeout=90)
    assert final.state == JobState.SUCCEEDED, final.error
    assert_forgeries_refused(service, final, mark)


def test_a_cancel_past_the_jobs_grace_is_a_sigkill(service):
    code = textwrap.dedent(
        """
        import signal, time
        signal.signal(signal.SIGTERM, lambda *_: print("SIGTERM ignored", flush=True))
        print("ready", flush=True)
        while True:
            time.sleep(0.1)
        """
    )
    spec = JobSpec.from_options({"backend": "slurm", "workers": 1})
    job = service.submit(spec, Payload(source=code), grace=1.0)  # --grace 1s
    wait_for(lambda: rank_lines(service, job.id) == ["ready"], 60, message="the rank runs")
    started = time.monotonic()
    record = service.cancel(job.id)
    took = time.monotonic() - started
    assert record.state == JobState.CANCELLED
    # ... and where it was, read before it was signalled (issue 33; its loop's line).
    assert record.reason.startswith(
        "cancelled by user; rank 0 had not exited 1 s after SIGTERM and was killed; "
        "rank 0 was in <module> (cell.py:"
    ), record.reason
    assert "SIGTERM ignored" in rank_lines(service, job.id)
    assert rank_lines(service, job.id, stream="system") == [
        "[mlcluster] stopping (cancelled by user): SIGTERM, then SIGKILL after 1 s",
        "[mlcluster] rank 0 had not exited 1 s after SIGTERM: killed",
    ]
    assert 1.0 <= took < 1.0 + 20
    assert record.ranks[0].state == "cancelled" and record.ranks[0].exit_code is None


def test_each_ranks_output_arrives_whole_and_in_order(service):
    code = textwrap.dedent(
        """
        import os, sys
        for i in range(2000):
            print(f"out {i}")
            if i % 100 == 0:
                print(f"err {i}", file=sys.stderr)
        """
    )
    job = submit(service, code, workers=2)
    assert service.wait(job.id, timeout=60).state == JobState.SUCCEEDED
    for rank in (0, 1):
        lines, _ = service.logs(job.id, rank=rank)
        out = [line["line"] for line in lines if line["stream"] == "stdout"]
        err = [line["line"] for line in lines if line["stream"] == "stderr"]
        assert out == [f"out {i}" for i in range(2000)]
        assert err == [f"err {i}" for i in range(0, 2000, 100)]


def test_a_rank_gets_the_cpus_it_asked_for(service, slurm):
    code = "import os\nprint(os.environ['SLURM_CPUS_PER_TASK'], os.environ['OMP_NUM_THREADS'])\n"
    job = submit(service, code, workers=1, cpus=2)
    assert service.wait(job.id, timeout=60).state == JobState.SUCCEEDED
    assert rank_lines(service, job.id) == ["2 2"]  # the step's own --cpus-per-task


def test_a_rank_killed_by_a_signal_is_named_from_sruns_words(service):
    """A rank killed outright (as the OOM killer does) leaves no exit status of its own: the
    culprit is the task srun says ended first."""
    code = textwrap.dedent(
        """
        import os, signal, time
        if os.environ["RANK"] == "1":
            time.sleep(0.5)
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(120)
        """
    )
    job = submit(service, code, workers=2)
    record = service.wait(job.id, timeout=90)
    assert record.state == JobState.FAILED
    assert record.failed_rank == 1
    assert record.error == "rank 1 failed: srun: task 1: Killed"
    assert {r.rank: r.state for r in record.ranks} == {0: "cancelled", 1: "failed"}


def test_slurm_extra_args_reach_sbatch_and_its_refusal(slurm_store, tmp_path):
    from jupyterlab_mlcluster.jobs.service import JobService

    (tmp_path / "jupyter-config" / "jupyter_mlcluster_config.json").write_text(
        json.dumps({"MLClusterConfig": {"slurm_extra_args": ["--constraint=a100"]}})
    )
    service = JobService()
    with pytest.raises(SpecError, match="Invalid feature specification"):
        submit(service, "print(1)")
    assert service.store.list_jobs()[1] == 0


def test_jax_ranks_get_their_coordinator_on_rank_0s_host(service, slurm):
    code = (
        "import os\nprint(os.environ['JAX_COORDINATOR_ADDRESS'], os.environ['JAX_PROCESS_ID'],"
        " os.environ['JAX_NUM_PROCESSES'])\n"
    )
    job = submit(service, code, workers=2, framework="jax")
    assert service.wait(job.id, timeout=60).state == JobState.SUCCEEDED
    lines = [line.split() for line in rank_lines(service, job.id)]
    assert sorted(words[1] for words in lines) == ["0", "1"]
    (address,) = {words[0] for words in lines}
    host, port = address.split(":")
    assert host == slurm.node and int(port) > 0 and {words[2] for words in lines} == {"2"}
