"""A warm rank carries nothing of the supervisor or the zygote it was forked from (issue 30):
each test runs one script, unchanged, under `torchrun --standalone`, under `mlcluster run`
with cold ranks (MLCLUSTER_WARM_POOL=0) and with warm ones, in the same test."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import run_cli

from jupyterlab_mlcluster.jobs import warm
from jupyterlab_mlcluster.jobs.service import JobService

SCRIPTS = Path(__file__).parent / "scripts"
WORKERS = 2
LAUNCHES = ("torchrun", "cold", "warm")
ZYGOTE = "jupyterlab_mlcluster.jobs.warm.zygote"  # a warm rank's parent still runs its argv


def launch(how: str, workdir: Path, *args: str) -> subprocess.CompletedProcess:
    if how == "torchrun":
        return subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--standalone"]
            + [f"--nproc-per-node={WORKERS}", *args],
            cwd=workdir,
            capture_output=True,
            text=True,
            timeout=240,
            check=False,
        )
    env = {**os.environ, "MLCLUSTER_WARM_POOL": "1" if how == "warm" else "0"}
    return run_cli("run", "--workers", str(WORKERS), *args, cwd=workdir, env=env, timeout=240)


def workdir_with(tmp_path: Path, how: str, script: str) -> Path:
    where = tmp_path / how
    (where / "out").mkdir(parents=True)
    shutil.copy(SCRIPTS / script, where / script)
    return where


@pytest.fixture
def pool_stopped(store_dir):
    """The warm runs start from no generation (one left by an earlier test may preload less)
    and leave none behind."""
    warm.stop(JobService().config)
    yield
    warm.stop(JobService().config)


def test_a_library_warning_never_lands_in_a_users_file(store_dir, pool_stopped, tmp_path):
    """Issue 30's report: a script opens 8 files and writes USER DATA to each, then a library
    logs a warning. Before, a warm rank still had the supervisor's RotatingFileHandler on its
    root logger, whose descriptor the rank had closed: the user's file that got that number
    received the log line. Now no file changes under any launcher, the warning reaches
    stderr through Python's last resort as in a fresh interpreter, no "Logging error" is
    printed, and the user's own logging.basicConfig takes effect."""
    for how in LAUNCHES:
        workdir = workdir_with(tmp_path, how, "user_files_and_logging.py")
        proc = launch(how, workdir, "user_files_and_logging.py", "out")
        output = proc.stdout + proc.stderr
        assert proc.returncode == 0, (how, output)
        out = workdir / "out"
        for rank in range(WORKERS):
            for i in range(8):
                assert (out / f"user-{rank}-{i}.txt").read_text() == "USER DATA\n", (how, i)
            assert (out / f"own-log-{rank}.txt").read_text() == (
                f"INFO mylib: the user's own logging on rank {rank}\n"
            ), how
            assert f"library warning on rank {rank}" in output, (how, output)
        assert "Logging error" not in output and "Bad file descriptor" not in output, how
        assert "started cold" not in output, (how, output)
    # The warm run was served by the pool, not started cold behind our back.
    assert warm.pool_status(JobService().config)["generations"]


# Values that name one run (its port, pids, descriptor numbers): compared by presence; the job
# id in the others (paths in the job's directory) is replaced by a placeholder.
PER_RUN = {
    "MASTER_PORT",
    "MLCLUSTER_SUPERVISOR_PID",
    "MLCLUSTER_REPORT",
    "MLCLUSTER_WARM_POOL",  # the switch this test turns
}
# A warm rank skips the exit-time finalizers torch registered when the zygote imported it
# (jobs/warm/rank.py: they only tear down in-process state, over copy-on-write pages).
SKIPPED_FINALIZERS = {"torch.library._del_library"}
RANK_ADDITIONS = {"PYTHONUNBUFFERED", "CUDA_DEVICE_ORDER", "CUDA_VISIBLE_DEVICES"}
# A cold rank runs the worker as __main__; a warm one imported it by name.
ENTRY = "jupyterlab_mlcluster.runtime.worker"


def probe(tmp_path: Path, how: str) -> dict[int, dict]:
    workdir = workdir_with(tmp_path, how, "probe_leftovers.py")
    proc = launch(how, workdir, "probe_leftovers.py", "out", how)
    assert proc.returncode == 0, (how, proc.stdout + proc.stderr)
    return {
        rank: json.loads((workdir / "out" / f"{how}-{rank}.json").read_text())
        for rank in range(WORKERS)
    }


def comparable(seen: dict) -> dict:
    """What must agree between launchers: all of it but per-run values and who started us."""
    seen = dict(seen)
    seen.pop("parent")
    job = seen["environ"].get("MLCLUSTER_JOB_ID") or seen["environ"]["TORCHELASTIC_RUN_ID"]
    seen["environ"] = {
        k: "<per run>" if k in PER_RUN else v.replace(job, "<job>")
        for k, v in seen["environ"].items()
    }
    # The report channel is the one descriptor a rank of ours has on purpose (its number
    # differs by launch); the stack helper's file is opened when the launcher asks for it.
    seen["descriptors"] = sorted(
        what for what in seen["descriptors"].values() if not what.endswith(".stacks")
    )
    seen["exit_finalizers"] = [f for f in seen["exit_finalizers"] if f not in SKIPPED_FINALIZERS]
    seen["our_modules"] = [m for m in seen["our_modules"] if m != ENTRY]
    return seen


def test_a_warm_rank_has_no_leftovers(store_dir, pool_stopped, tmp_path):
    """Loggers (root and named: handlers, levels), signal handlers, the signal mask and
    wakeup fd, open descriptors, threads, os.environ, our modules, atexit handlers and
    exit-time finalizers, hooks: a warm rank's equal a cold rank's, and apart from what
    only our ranks have (the report channel, MLCLUSTER_* variables, our runtime's modules)
    a torchrun worker's."""
    seen = {how: probe(tmp_path, how) for how in LAUNCHES}
    for rank in range(WORKERS):
        assert ZYGOTE in seen["warm"][rank]["parent"], seen["warm"][rank]["parent"]
        assert ZYGOTE not in seen["cold"][rank]["parent"]
        warm_rank, cold_rank = comparable(seen["warm"][rank]), comparable(seen["cold"][rank])
        for key in cold_rank:
            assert warm_rank[key] == cold_rank[key], (key, warm_rank[key], cold_rank[key])

        torchrun_rank = comparable(seen["torchrun"][rank])
        assert not any(m.startswith("jupyterlab_mlcluster") for m in torchrun_rank["our_modules"])
        assert torchrun_rank["descriptors"] == []
        assert cold_rank["descriptors"] == ["report channel"]
        ours_only = {"environ", "our_modules", "descriptors"}
        for key in set(cold_rank) - ours_only:
            assert cold_rank[key] == torchrun_rank[key], (key, cold_rank[key], torchrun_rank[key])
        # What ours have beyond a torchrun worker's environment: our own variables and what
        # launcher.rank_environment adds (nothing of the supervisor's or the zygote's). (What
        # torchrun's agent adds that ours lack is no leftover: test_fresh_interpreter.py.)
        extra = set(cold_rank["environ"]) - set(torchrun_rank["environ"])
        assert all(name.startswith("MLCLUSTER_") or name in RANK_ADDITIONS for name in extra), extra
