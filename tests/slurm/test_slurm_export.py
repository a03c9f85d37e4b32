"""`mlcluster export JOB --as sbatch` runs again on the test Slurm (issue 35, item 5): the
job's sbatch options (the Slurm backend's own builder), one srun task per rank, the ranks
meeting over gloo as they did in the notebook."""

from __future__ import annotations

import os
import subprocess
import sys

from export_jobs import store_cell_job
from helpers import run_cli


def test_an_sbatch_export_runs_on_slurm(slurm, service, tmp_path):
    out = tmp_path / "out.txt"
    record = store_cell_job(service, env={"EXPORT_OUT": str(out)}, timeout=600)
    target = tmp_path / "away"
    done = run_cli("export", record.id, "--as", "sbatch", "-o", str(target))
    assert done.returncode == 0, done.stderr
    batch = (target / "train_cell4.sbatch").read_text()
    for option in ("--ntasks=2", "--cpus-per-task=1", "--time=0:10:00", "--job-name=train-cell4"):
        assert f"#SBATCH {option}\n" in batch, batch
    assert "--comment" not in batch and "--parsable" not in batch  # the backend's own
    ran = subprocess.run(
        ["sbatch", "--wait", str(target / "train_cell4.sbatch")],
        cwd=target,
        env=slurm.env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    logs = "".join(p.read_text() for p in target.glob("train_cell4-*.out"))
    assert ran.returncode == 0, ran.stdout + ran.stderr + logs + slurm.logs()
    assert out.read_text() == "9 2 hihi"
    assert os.access(target / "train_cell4.sbatch", os.X_OK) and sys.executable in batch
