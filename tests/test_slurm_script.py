"""The slurm backend's pure builders and parsers (backends/slurm/script.py): no Slurm needed.
The real daemons are exercised in tests/slurm/."""

from __future__ import annotations

import pytest

from jupyterlab_mlcluster.backends.slurm import script
from jupyterlab_mlcluster.jobs.model import JobSpec, SpecError


def spec(**options) -> JobSpec:
    return JobSpec.from_options({"backend": "slurm", **options})


def test_sbatch_arguments_carry_every_option():
    args = script.sbatch_arguments(
        spec(
            workers=8,
            gpus_per_worker=1,
            cpus=2.5,
            memory="4Gi",
            timeout="90s",
            queue="gpu",
            priority=-5,
            name="train",
        ),
        job_id="j0123456789",
        attempt_dir="/shared/jobs/j0123456789/slurm/attempt-0",
        account="lab",
        extra_args=["--constraint=a100"],
    )
    assert "--ntasks=8" in args
    assert "--gpus-per-task=1" in args
    assert "--cpus-per-task=3" in args  # whole CPUs
    assert "--mem-per-cpu=1366M" in args  # 4 GiB over 3 CPUs, rounded up
    assert "--time=0:02:00" in args  # minutes, rounded up: the supervisor is exact
    assert "--partition=gpu" in args and "--account=lab" in args
    assert "--nice=5" in args
    assert "--job-name=train" in args
    assert "--comment=mlcluster:j0123456789" in args
    assert args[-1] == "--constraint=a100"
    assert "--output=/shared/jobs/j0123456789/slurm/attempt-0/batch.out" in args


def test_defaults_and_partition_from_config():
    args = script.sbatch_arguments(spec(), job_id="j1", attempt_dir="/d", partition="cpu")
    assert "--partition=cpu" in args and "--cpus-per-task=1" in args
    assert not [a for a in args if a.startswith(("--gpus", "--mem", "--time", "--nice", "--qos"))]


def test_without_a_timeout_the_tasks_get_sigterm_the_grace_before_slurms_time_limit():
    """The partition's time limit ends a job without --timeout: its tasks are told the
    job's grace before it (--signal), to save their work; with --timeout the supervisor
    stops the job itself, to the second (SIGTERM, then the grace), before --time's minute."""
    args = script.sbatch_arguments(spec(), job_id="j1", attempt_dir="/d", grace=2.5)
    assert "--signal=TERM@3" in args
    timed = script.sbatch_arguments(spec(timeout="90s"), job_id="j1", attempt_dir="/d", grace=3)
    assert not [a for a in timed if a.startswith("--signal")]


def test_priority_is_a_qos_where_configured_else_a_nice_value():
    assert script.priority_arguments(10, {"10": "high"}) == ["--qos=high"]
    assert script.priority_arguments(-3, {}) == ["--nice=3"]
    assert script.priority_arguments(0, {}) == []
    assert script.priority_arguments(-(2**31), {}) == ["--nice=2147483645"]


def test_an_image_is_refused():
    with pytest.raises(SpecError, match="kubernetes"):
        script.sbatch_arguments(spec(image="python:3.12"), job_id="j1", attempt_dir="/d")


def test_batch_script_starts_every_task_in_one_srun_step():
    text = script.batch_script(
        python="/opt/py env/bin/python", attempt_dir="/d", spec=spec(cpus=3, gpus_per_worker=2)
    )
    srun = [line for line in text.splitlines() if "srun" in line]
    assert len(srun) == 1
    assert "--kill-on-bad-exit=1" in srun[0]
    # Asked again in the step (22.05's srun does not inherit sbatch's --cpus-per-task).
    assert "--cpus-per-task=3 --gpus-per-task=2" in srun[0]
    assert "--output=/d/rank-%t.out" in srun[0] and "--error=/d/rank-%t.err" in srun[0]
    assert "'/opt/py env/bin/python' -m jupyterlab_mlcluster.backends.slurm.rank" in srun[0]
    assert "export MASTER_PORT" in text


@pytest.mark.parametrize(
    "nodelist, first",
    [
        ("vm", "vm"),
        ("gpu[07-09,12],cpu1", "gpu07"),
        ("n[3]", "n3"),
        ("a1,b2", "a1"),
        ("rack-[10-11]", "rack-10"),
    ],
)
def test_first_host_of_a_hostlist(nodelist, first):
    assert script.first_host(nodelist) == first


def test_tasks_on_node():
    assert script.tasks_on_node("2(x3),1", 3) == 1
    assert script.tasks_on_node("2(x3),1", 2) == 2
    assert script.tasks_on_node("4", 0) == 4


def test_rank_environment_from_slurms_variables():
    env = {
        "SLURM_PROCID": "5",
        "SLURM_NTASKS": "8",
        "SLURM_LOCALID": "1",
        "SLURM_NODEID": "1",
        "SLURM_STEP_TASKS_PER_NODE": "4(x2)",
        "SLURM_STEP_NUM_NODES": "2",
        "SLURM_JOB_NODELIST": "gpu[07-08]",
        "MLCLUSTER_SLURM_ERROR_FILES": "/s/error-{rank}.json",
        "MLCLUSTER_SLURM_RESULT_PATH": "/s/result.pkl",
    }
    out = script.rank_environment(env, "/s/slurm/attempt-0")
    assert out["RANK"] == "5" and out["WORLD_SIZE"] == "8"
    assert out["LOCAL_RANK"] == "1" and out["LOCAL_WORLD_SIZE"] == "4"
    assert out["GROUP_RANK"] == "1" and out["GROUP_WORLD_SIZE"] == "2"
    assert out["MASTER_ADDR"] == "gpu07"
    assert out["MLCLUSTER_ERROR_FILE"] == out["TORCHELASTIC_ERROR_FILE"] == "/s/error-5.json"
    assert "MLCLUSTER_RESULT_PATH" not in out  # rank 0's alone
    rank0 = script.rank_environment({**env, "SLURM_PROCID": "0"}, "/s/slurm/attempt-0")
    assert rank0["MLCLUSTER_RESULT_PATH"] == "/s/result.pkl"


def test_squeue_rows_and_ours():
    text = "12|PENDING|Resources||mlcluster:j1\n13|CANCELLED by 0|None|vm|mlcluster:j2\n\n"
    rows = script.parse_jobs(text)
    assert rows[1]["state"] == "CANCELLED"
    assert [r["id"] for r in script.ours(rows, "j1")] == ["12"]


def test_pending_reason_keeps_slurms_word():
    assert script.pending_reason("Resources").startswith("waiting in Slurm: Resources (")
    assert script.pending_reason("QOSMaxGRESPerUser") == (
        "waiting in Slurm: QOSMaxGRESPerUser (your QOS's GPU limit is reached)"
    )
    assert script.pending_reason("SomethingNew") == "waiting in Slurm: SomethingNew"


def test_job_outcome_of_final_states():
    assert script.job_outcome("RUNNING") is None
    assert script.job_outcome("TIMEOUT")[0] == "timeout"
    assert "NODE_FAIL" in script.job_outcome("NODE_FAIL")[1]
    assert "PREEMPTED" in script.job_outcome("PREEMPTED")[1]
    assert script.job_outcome("COMPLETED") is None  # its ranks say how it went


def test_sinfo_per_partition():
    text = (
        "g1|gpu*|4/60/0/64|gpu:a100:4(S:0-1)|gpu:a100:1(IDX:0)|512000|mixed|16000|\n"
        "g2|gpu*|0/64/0/64|gpu:a100:4(S:0-1)|gpu:a100:0(IDX:N/A)|512000|idle|0|\n"
        "g3|gpu*|0/0/64/64|gpu:a100:4|gpu:a100:0|512000|drained|0|\n"
        "c1|cpu|2/0/0/2|(null)|(null)|1000|allocated|1000|\n"
    )
    parts = script.parse_sinfo(text)
    assert parts["gpu"] == {
        "default": True,
        "nodes": 3,
        "cpus_total": 192,
        "cpus_idle": 124,
        "gpus_total": 12,
        "gpus_idle": 7,
        "memory_mb": 1536000,
        "memory_free_mb": 1008000,  # a drained node's memory is not free
    }
    assert parts["cpu"]["cpus_idle"] == 0 and parts["cpu"]["gpus_total"] == 0


def test_slurm_error_keeps_its_words():
    stderr = (
        "sbatch: error: invalid partition specified: nope\n"
        "allocation failure: Invalid partition name specified\n"
    )
    assert script.slurm_error(stderr) == (
        "sbatch: error: invalid partition specified: nope; "
        "allocation failure: Invalid partition name specified"
    )


def test_srun_says_which_task_ended_badly_first():
    text = (
        "srun: error: vm: task 1: Killed\n"
        "srun: launch/slurm: _step_signal: Terminating StepId=7.0\n"
        "slurmstepd: error: *** STEP 7.0 ON vm CANCELLED AT 2026-11-26T20:23:52 ***\n"
        "srun: error: vm: task 0: Killed\n"
    )
    assert script.srun_task_failure(text) == (1, "Killed")
    assert script.srun_task_failure("srun: error: n1: tasks 2-3: Exited with exit code 9\n") == (
        2,
        "Exited with exit code 9",
    )
    assert script.srun_task_failure("all fine\n") is None


def test_jax_gets_its_coordinator_and_tensorflow_is_refused():
    text = script.batch_script(python="python", attempt_dir="/d", spec=spec(framework="jax"))
    assert "export MLCLUSTER_SLURM_JAX_PORT" in text
    env = {
        "SLURM_PROCID": "1",
        "SLURM_NTASKS": "2",
        "SLURM_JOB_NODELIST": "n[1-2]",
        "MLCLUSTER_SLURM_ERROR_FILES": "/s/error-{rank}.json",
        "MLCLUSTER_SLURM_JAX_PORT": "4567",
    }
    out = script.rank_environment(env, "/d")
    assert out["JAX_COORDINATOR_ADDRESS"] == "n1:4567"
    assert out["JAX_PROCESS_ID"] == "1" and out["JAX_NUM_PROCESSES"] == "2"
    assert "export MLCLUSTER_SLURM_JAX_PORT" not in script.batch_script(
        python="python", attempt_dir="/d", spec=spec()
    )
    with pytest.raises(SpecError, match="tensorflow is not supported on the slurm backend"):
        script.sbatch_arguments(spec(framework="tensorflow"), job_id="j1", attempt_dir="/d")
