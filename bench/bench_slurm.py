"""The slurm backend against plain `sbatch` + `srun torchrun`, same script, same Slurm, one run.

    python bench/bench_slurm.py [--runs 5] [--workers 2]

Starts its own one-node Slurm (tests/slurm/cluster.py: munged, slurmctld, slurmd as root, in
a temporary directory), then runs the same user script (a gloo all_reduce of rank+1) with:
  mlcluster        JobService.submit(JobSpec(backend="slurm", workers=N), script).wait():
                   one sbatch allocation of N tasks, one srun step, the runtime worker in each
  mlcluster-cli    `mlcluster run --backend slurm --workers N script.py` (the CLI's own start
                   and its live log follow included)
  sbatch+torchrun  `sbatch --ntasks=1 --cpus-per-task=N` of a batch script running
                   `srun torchrun --standalone --nproc-per-node N script.py`, what a Slurm user
                   writes by hand; its end is squeue saying COMPLETED (asked every 0.1 s)
and reports per method (medians over --runs, after one uncounted warm-up run each):
  first  - seconds from the request until the first rank runs the first line of user code
  up     - until the last rank does
  ready  - until the last rank has finished init_process_group + all_reduce
  total  - until the caller has the job's end (the call or command returned)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from tests.slurm.cluster import SlurmCluster, missing

SCRIPT = textwrap.dedent(
    """
    import json, os, sys, time
    t_first = time.time()
    import torch, torch.distributed as dist
    dist.init_process_group("gloo")
    t = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(t)
    t_ready = time.time()
    marks = os.environ["BENCH_MARKS"]
    with open(os.path.join(marks, f"rank-{dist.get_rank()}.json"), "w") as f:
        json.dump({"first": t_first, "ready": t_ready, "sum": t.item()}, f)
    dist.destroy_process_group()
    """
)


def read_marks(marks: Path, workers: int, t0: float) -> dict[str, float]:
    found = [json.loads((marks / f"rank-{r}.json").read_text()) for r in range(workers)]
    expected = workers * (workers + 1) / 2
    assert all(m["sum"] == expected for m in found), found
    return {
        "first": min(m["first"] for m in found) - t0,
        "up": max(m["first"] for m in found) - t0,
        "ready": max(m["ready"] for m in found) - t0,
    }


def fresh_marks(work: Path, name: str) -> Path:
    marks = Path(tempfile.mkdtemp(prefix=f"marks-{name}-", dir=work))
    os.environ["BENCH_MARKS"] = str(marks)
    return marks


def run_mlcluster(work: Path, script: Path, workers: int) -> dict[str, float]:
    import jupyterlab_mlcluster.backends  # noqa: F401 - fills the backend registry
    from jupyterlab_mlcluster.jobs.model import JobSpec
    from jupyterlab_mlcluster.jobs.service import JobService
    from jupyterlab_mlcluster.runtime.payload import Payload

    marks = fresh_marks(work, "mlcluster")
    service = JobService()
    t0 = time.time()
    spec = JobSpec.from_options({"backend": "slurm", "workers": workers})
    job = service.submit(spec, Payload(kind="script", filename=str(script)))
    record = service.wait(job.id, timeout=300)
    total = time.time() - t0
    assert str(record.state) == "succeeded", record.error
    return {**read_marks(marks, workers, t0), "total": total}


def run_cli(work: Path, script: Path, workers: int) -> dict[str, float]:
    marks = fresh_marks(work, "cli")
    t0 = time.time()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "jupyterlab_mlcluster.cli",
            "run",
            "--backend",
            "slurm",
            "--workers",
            str(workers),
            str(script),
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
    )
    total = time.time() - t0
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return {**read_marks(marks, workers, t0), "total": total}


def run_sbatch_torchrun(
    work: Path, script: Path, workers: int, cluster: SlurmCluster
) -> dict[str, float]:
    marks = fresh_marks(work, "sbatch")
    torchrun = Path(sys.executable).with_name("torchrun")
    batch = work / "torchrun.sh"
    batch.write_text(
        f"#!/bin/sh\nexec srun {torchrun} --standalone --nproc-per-node {workers} {script}\n"
    )
    env = {**cluster.env, **os.environ}
    t0 = time.time()
    job = subprocess.run(
        [
            "sbatch",
            "--parsable",
            "--ntasks=1",
            f"--cpus-per-task={workers}",
            f"--output={work / 'torchrun-%j.out'}",
            f"--chdir={work}",
            str(batch),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=True,
    ).stdout.strip()
    # Until Slurm says it ended, asked every 0.1 s (`sbatch --wait` asks ever more rarely,
    # up to every 32 s: it would measure its polling, not the job).
    while True:
        state = subprocess.run(
            ["squeue", "--noheader", "--states=all", f"--jobs={job}", "--format=%T"],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
            check=False,
        ).stdout.strip()
        if state and state not in ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING"):
            break
        time.sleep(0.1)
    total = time.time() - t0
    assert state == "COMPLETED", (state, (work / f"torchrun-{job}.out").read_text())
    return {**read_marks(marks, workers, t0), "total": total}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    why = missing()
    if why:
        sys.exit(f"bench_slurm: no Slurm here: {why}")
    work = Path(tempfile.mkdtemp(prefix="bench-slurm-"))
    os.environ["MLCLUSTER_STORE_DIR"] = str(work / "store")
    os.environ["JUPYTER_CONFIG_DIR"] = str(work / "jupyter-config")
    os.environ["MLCLUSTER_WARM_POOL"] = "0"
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]
    )
    script = work / "allreduce.py"
    script.write_text(SCRIPT)
    cluster = SlurmCluster(work / "slurm")
    methods = {
        "mlcluster": lambda: run_mlcluster(work, script, args.workers),
        "mlcluster-cli": lambda: run_cli(work, script, args.workers),
        "sbatch+torchrun": lambda: run_sbatch_torchrun(work, script, args.workers, cluster),
    }
    results: dict[str, list[dict[str, float]]] = {name: [] for name in methods}
    firsts: dict[str, dict[str, float]] = {}
    try:
        cluster.start()
        os.environ["SLURM_CONF"] = str(cluster.conf)
        for name, method in methods.items():  # warm-up: page cache, Slurm's first job
            firsts[name] = method()
        for _ in range(args.runs):
            for name, method in methods.items():  # interleaved: load hits all alike
                results[name].append(method())
                cluster.wait_empty(60)
    finally:
        cluster.stop()
    keys = ("first", "up", "ready", "total")
    print(
        f"\n{args.workers}-rank gloo all_reduce on a one-node Slurm 22.05, "
        f"median of {args.runs} runs (s)\n"
    )
    print(
        "| method | first rank running | all ranks running | all_reduce done | total | first run total |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    for name, runs in results.items():
        med = {k: statistics.median(r[k] for r in runs) for k in keys}
        print(
            f"| {name} | {med['first']:.2f} | {med['up']:.2f} | {med['ready']:.2f} "
            f"| {med['total']:.2f} | {firsts[name]['total']:.2f} |"
        )


if __name__ == "__main__":
    main()
