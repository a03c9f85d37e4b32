"""A job's `env` never reaches the commands the supervisor runs on the submitter's host.

sbatch runs where the job is submitted (a notebook, a login node, a server) with that
account's credentials: a job's LD_PRELOAD, SLURM_CONF or SBATCH_* there would act on the
submission itself (another library loaded into sbatch, another cluster's controller, other
options). The job's variables go to its tasks through a file of the attempt instead
(backends/slurm/rank.py), so the tasks still get them, start-up ones (PYTHON*) included.

The attacker's job runs on the real one-node Slurm (conftest.py); the `sbatch` it meets is a
wrapper that writes down the environment it was given, then execs the real one.
"""

from __future__ import annotations

import json
import os
import shutil
import stat

import pytest
from helpers import wait_for

from jupyterlab_mlcluster.jobs.model import JobSpec, JobState
from jupyterlab_mlcluster.runtime.payload import Payload

# What an attacker puts in the job's `env` to act on sbatch itself, and one harmless variable.
BOBS = {
    "LD_PRELOAD": "/tmp/bob-owns-sbatch.so",
    "LD_LIBRARY_PATH": "/tmp/bob-libs",
    "SLURM_CONF": "/tmp/bob-slurm.conf",
    "SBATCH_PARTITION": "bobs-partition",
    "SBATCH_EXPORT": "ALL",
    "SRUN_CPUS_PER_TASK": "64",
    "PYTHONOPTIMIZE": "2",
    "BOBS_FLAG": "bob",
}
COMMANDS = ("sbatch", "squeue", "scancel", "scontrol", "sinfo")


@pytest.fixture
def watched_sbatch(slurm_store, tmp_path):
    """slurm_bin_dir whose sbatch records its environment (one JSON file per call)."""
    bin_dir, seen = tmp_path / "slurm-bin", tmp_path / "sbatch-saw"
    bin_dir.mkdir()
    seen.mkdir()
    for command in COMMANDS:
        real = shutil.which(command)
        assert real, f"{command} not on PATH"
        if command != "sbatch":
            (bin_dir / command).symlink_to(real)
            continue
        wrapper = bin_dir / "sbatch"
        python = shutil.which("python3") or "/usr/bin/python3"
        wrapper.write_text(
            "#!/bin/sh\n"
            f"{python} -I -c 'import json, os, sys, uuid; "
            f'json.dump(dict(os.environ), open(sys.argv[1] + "/" + uuid.uuid4().hex, "w"))\' '
            f"{seen} || exit 99\n"
            f'exec {real} "$@"\n'
        )
        wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    config = slurm_store.parent / "jupyter-config" / "jupyter_mlcluster_config.json"
    settings = json.loads(config.read_text())
    settings["MLClusterConfig"]["slurm_bin_dir"] = str(bin_dir)
    config.write_text(json.dumps(settings))
    return seen


def test_attack_job_env_reaches_sbatch_on_the_submitters_host(watched_sbatch, monkeypatch):
    from jupyterlab_mlcluster.jobs.service import JobService

    monkeypatch.setenv("SERVER_SECRET", "the submitter's own")
    service = JobService()
    assert service.config.slurm_bin_dir, "the wrapper must be the sbatch the job meets"
    code = (
        "import json, os, sys\n"
        "keys = " + repr(sorted(BOBS)) + "\n"
        "print(json.dumps({'env': {k: os.environ.get(k) for k in keys},"
        " 'optimize': sys.flags.optimize}))\n"
    )
    spec = JobSpec.from_options({"backend": "slurm", "workers": 1, "env": dict(BOBS)})
    job = service.submit(spec, Payload(source=code))
    try:
        wait_for(lambda: service.get(job.id).final, timeout=120)
    finally:
        if not service.get(job.id).final:
            service.cancel(job.id)
    calls = [json.loads(p.read_text()) for p in watched_sbatch.iterdir()]
    assert calls, "sbatch was never run"
    for seen in calls:
        # None of Bob's variables, under his value, in sbatch's environment.
        leaked = {k: seen[k] for k in BOBS if seen.get(k) == BOBS[k]}
        assert not leaked, leaked
        assert "LD_PRELOAD" not in seen and "BOBS_FLAG" not in seen
        assert not [k for k in seen if k.startswith(("SBATCH_", "SRUN_"))], sorted(seen)
        assert seen.get("SLURM_CONF") == os.environ["SLURM_CONF"]  # the cluster we talk to

    final = service.get(job.id)
    assert final.state == JobState.SUCCEEDED, (final.state, final.error)
    # The task still gets every variable of the job, those the interpreter reads as it
    # starts included (it ran with PYTHONOPTIMIZE=2).
    lines = [line["line"] for line in service.logs(job.id)[0] if line["line"].startswith("{")]
    assert lines, service.logs(job.id)[0]
    task = json.loads(lines[0])
    assert task["env"] == BOBS and task["optimize"] == 2, task
