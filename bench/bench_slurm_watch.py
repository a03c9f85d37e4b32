"""Slurm asked once: squeue calls a second with many Slurm jobs followed at once.

    python bench/bench_slurm_watch.py [--jobs 100] [--window 20]

Starts its own one-node Slurm (tests/slurm/cluster.py: 2 CPUs, so 2 one-rank jobs run and
the rest wait in Slurm's queue), points the slurm backend at a `squeue` wrapper that logs
each call, submits --jobs jobs (each sleeping until cancelled: every one has a supervisor
following its allocation) and reports:
  squeue/s   calls a second over --window seconds once every job has its supervisor and
             its place in Slurm's queue (issue 34: ≤ 1, was 48 a second for 13 jobs)
  positions  whether every waiting job was told its exact place (1..N-2)
  seen       seconds from an outside `scancel` of a waiting job until its record is final,
             for 3 jobs (issue 34: a state change seen within 2 s)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from tests.slurm.cluster import SlurmCluster, missing

COMMANDS = ("sbatch", "scancel", "scontrol", "sinfo", "sacct")


def counting_bin(work: Path) -> tuple[Path, Path]:
    bin_dir, calls = work / "slurm-bin", work / "squeue-calls"
    bin_dir.mkdir()
    for command in COMMANDS:
        (bin_dir / command).symlink_to(shutil.which(command))
    wrapper = bin_dir / "squeue"
    wrapper.write_text(f'#!/bin/sh\ndate +%s.%N >> {calls}\nexec {shutil.which("squeue")} "$@"\n')
    wrapper.chmod(0o755)
    return bin_dir, calls


def wait(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit(f"bench_slurm_watch: timed out waiting for {what}")
        time.sleep(0.5)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=100)
    parser.add_argument("--window", type=float, default=20.0)
    args = parser.parse_args()
    why = missing()
    if why:
        sys.exit(f"bench_slurm_watch: no Slurm here: {why}")
    work = Path(tempfile.mkdtemp(prefix="bench-slurm-watch-"))
    bin_dir, calls = counting_bin(work)
    os.environ["MLCLUSTER_STORE_DIR"] = str(work / "store")
    os.environ["JUPYTER_CONFIG_DIR"] = str(work / "jupyter-config")
    os.environ["MLCLUSTER_WARM_POOL"] = "0"
    (work / "jupyter-config").mkdir()
    (work / "jupyter-config" / "jupyter_mlcluster_config.json").write_text(
        json.dumps({"MLClusterConfig": {"slurm_bin_dir": str(bin_dir)}})
    )
    cluster = SlurmCluster(work / "slurm")
    try:
        cluster.start()
        os.environ["SLURM_CONF"] = str(cluster.conf)
        report = run(args.jobs, args.window, calls, cluster)
    finally:
        cluster.stop()
    print(json.dumps(report, indent=1))


def run(jobs: int, window: float, calls: Path, cluster: SlurmCluster) -> dict:
    import jupyterlab_mlcluster.backends  # noqa: F401 - fills the backend registry
    from jupyterlab_mlcluster.jobs.model import JobSpec
    from jupyterlab_mlcluster.jobs.service import JobService
    from jupyterlab_mlcluster.runtime.payload import Payload

    service = JobService()
    spec = JobSpec.from_options({"backend": "slurm", "workers": 1})
    t0 = time.time()
    ids = [
        service.submit(spec, Payload(source="import time\ntime.sleep(3600)\n")).id
        for _ in range(jobs)
    ]
    submitted = time.time() - t0

    def places() -> dict[str, int]:
        found = {}
        for record in service.list(limit=jobs)[0]:
            reason = record.reason or ""
            if "position " in reason:
                found[record.id] = int(reason.split("position ")[1].split()[0])
        return found

    wait(lambda: len(places()) == jobs - 2, 600, "every waiting job's place")
    settled = time.time() - t0
    exact = sorted(places().values()) == list(range(1, jobs - 1))
    start = time.time()
    time.sleep(window)
    times = [float(t) for t in calls.read_text().split()]
    in_window = [t for t in times if start <= t <= start + window]
    seen = []
    for job_id, _ in sorted(places().items(), key=lambda item: -item[1])[:3]:
        slurm_id = service.get(job_id).backend_state["slurm_job_id"]
        cancelled_at = time.time()
        cluster.run("scancel", slurm_id)
        deadline = time.monotonic() + 60
        while not service.get(job_id).final and time.monotonic() < deadline:
            time.sleep(0.02)
        seen.append(time.time() - cancelled_at)
    for job_id in ids:
        service.cancel(job_id, wait=False)
    wait(lambda: all(service.get(i).final for i in ids), 600, "every job to end")
    return {
        "jobs": jobs,
        "submit_s": round(submitted, 1),
        "all_placed_s": round(settled, 1),
        "squeue_calls_per_s": round(len(in_window) / window, 2),
        "positions_exact": exact,
        "cancel_seen_s": [round(s, 2) for s in seen],
        "cancel_seen_median_s": round(statistics.median(seen), 2),
    }


if __name__ == "__main__":
    main()
