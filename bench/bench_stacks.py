"""Forensics of a hung job (issue 33), on the local backend with real gloo ranks:

    python bench/bench_stacks.py [--workers 4] [--runs 5] [--stall-after 5] [--backend slurm]

  stacks    the folded stacks of a hung N-rank job (ranks 0, 2.. wait in all_reduce for
            rank 1, which sleeps), as `mlcluster stacks JOB` answers them: wall time of the
            whole command (a fresh process: imports, store, py-spy on every rank), beside
            `mlcluster jobs --limit 1` (the same CLI's start, no stacks), and of
            JobService.stacks alone in this process; medians over --runs (target <= 2 s),
            with the CPU seconds each took (theirs and their readers': what the machine's
            load does not change) and the load average. The commands run from a bytecode
            cache (as an installed package's do: PYTHONDONTWRITEBYTECODE, set in some dev
            shells, would have them compile every source file changed since it was last
            cached), warmed by a run not counted
  stall     a job whose ranks all sleep, --stall-after S: seconds from the ranks' last
            output until the job's record says it is stalled (target <= S + 10 s)

Each job runs in a store of its own, in a temporary directory; cold ranks (the warm pool
off) unless --warm. `--backend slurm`: the same on a real one-node Slurm started for the run
(tests/slurm/cluster.py, as root; its node has 2 CPUs, so at most 2 ranks).
`--backend kubernetes`: against the API emulator (tests/kube, a thread of this process), the
pods' ranks run here by its ClusterPlayer with the pod IP 127.0.0.1: read by each rank's own
helper over its pod's stack port (runtime/stack_port.py), as in a pod without SYS_PTRACE.
"""

from __future__ import annotations

import argparse
import datetime
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO)]  # tests.workloads: the hung job the tests read too

from tests.workloads import HANG

SLEEP = 'import time\nprint("ready", flush=True)\ntime.sleep(600)\n'
PLAYER: list = []  # --backend kubernetes: the ClusterPlayer that runs the pods' ranks


def _service():
    import jupyterlab_mlcluster.backends  # noqa: F401 - fills the backend registry
    from jupyterlab_mlcluster.jobs.service import JobService

    return JobService()


def _submit(service, code: str, **options) -> str:
    from jupyterlab_mlcluster.jobs.model import JobSpec
    from jupyterlab_mlcluster.runtime.payload import Payload

    options.setdefault("backend", os.environ.get("MLCLUSTER_BACKEND", "local"))
    job = service.submit(JobSpec.from_options(options), Payload(kind="code", source=code)).id
    if PLAYER:  # the cluster's side: the pods created, placed and their containers run
        import socket

        player = PLAYER[0]
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = str(s.getsockname()[1])
        for pod in player.create_pods(player.resumed(job)).values():
            player.schedule(pod)
            player.run_rank(pod, extra_env={"MASTER_PORT": port}, pod_ip="127.0.0.1")
    return job


def _ready_at(service, job_id: str, ranks: int, timeout: float = 300) -> float:
    """When the last rank printed 'ready' (its log line's own time, epoch seconds)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        record = service.get(job_id)
        if record.final:
            raise RuntimeError(f"job ended: {record.state} {record.error}")
        lines, _ = service.logs(job_id)
        ready = [line for line in lines if line["line"] == "ready"]
        if len({line["rank"] for line in ready}) == ranks:
            return max(datetime.datetime.fromisoformat(line["ts"]).timestamp() for line in ready)
        time.sleep(0.1)
    raise RuntimeError("ranks not ready")


def bench_stacks(workers: int, runs: int) -> None:
    from jupyterlab_mlcluster.jobs import forensics

    service = _service()
    job = _submit(service, HANG, workers=workers)
    print(f"backend {service.get(job).backend}")
    _ready_at(service, job, workers)
    while "all_reduce" not in " ".join(forensics.fold_lines(service.stacks(job))):
        time.sleep(0.2)
    cli, inproc, baseline = [], [], []
    cli_cpu, baseline_cpu = [], []
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = os.path.join(
        os.path.dirname(os.environ["MLCLUSTER_STORE_DIR"]), "pyc"
    )

    def command(*args: str) -> tuple[float, float, str]:
        """Wall and CPU seconds (its own and its children's: the readers) of one run."""
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        began = time.perf_counter()
        out = subprocess.run(
            [sys.executable, "-m", "jupyterlab_mlcluster.cli", *args],
            capture_output=True,
            text=True,
            check=True,
            env=env,
        )
        wall = time.perf_counter() - began
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
        return wall, cpu, out.stdout

    command("jobs", "--limit", "1")  # the bytecode cache written: runs not counted
    command("stacks", job)
    load = os.getloadavg()
    text = ""
    for _ in range(runs):
        wall, cpu, _ = command("jobs", "--limit", "1")
        baseline.append(wall)
        baseline_cpu.append(cpu)
        wall, cpu, text = command("stacks", job)
        cli.append(wall)
        cli_cpu.append(cpu)
        began = time.perf_counter()
        service.stacks(job)
        inproc.append(time.perf_counter() - began)
    service.cancel(job)
    print(text.split("\n", 1)[1].split("\n    ")[0] if "\n" in text else text)
    print(
        f"stacks of a hung {workers}-rank job: `mlcluster stacks` {statistics.median(cli):.2f} s"
        f" (min {min(cli):.2f}; CPU {statistics.median(cli_cpu):.2f} s),"
        f" JobService.stacks {statistics.median(inproc):.2f} s (min {min(inproc):.2f});"
        f" median of {runs}; target <= 2 s"
    )
    print(
        f"  (the same CLI's start alone, `mlcluster jobs --limit 1`: "
        f"{statistics.median(baseline):.2f} s, CPU {statistics.median(baseline_cpu):.2f} s;"
        f" load average {load[0]:.1f} before, {os.getloadavg()[0]:.1f} after,"
        f" on {os.cpu_count()} CPUs)"
    )


def bench_stall(workers: int, stall_after: float) -> None:
    service = _service()
    job = _submit(service, SLEEP, workers=workers, framework="none", stall_after=stall_after)
    quiet_since = _ready_at(service, job, workers)
    while True:
        record = service.get(job)
        if record.stall and len(record.stall["ranks"]) == workers:
            break
        if record.final:
            raise RuntimeError(f"job ended: {record.state}")
        time.sleep(0.05)
    flagged = time.time() - quiet_since
    service.cancel(job)
    print(
        f"stall of {workers} sleeping ranks flagged {flagged:.1f} s after their last output"
        f" (--stall-after {stall_after:g}; target <= {stall_after + 10:g} s)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--stall-after", type=float, default=5.0)
    parser.add_argument("--warm", action="store_true", help="ranks from the warm pool")
    parser.add_argument("--backend", choices=["local", "slurm", "kubernetes"], default="local")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["MLCLUSTER_STORE_DIR"] = os.path.join(tmp, "store")
        os.environ["MLCLUSTER_WARM_POOL"] = "1" if args.warm else "0"
        os.environ.setdefault("MLCLUSTER_CPU_SLOTS", str(args.workers))
        cluster = None
        if args.backend == "slurm":
            sys.path[:0] = [str(REPO), str(REPO / "tests")]
            from tests.slurm.cluster import NODE_CPUS, SlurmCluster, missing

            if missing() or args.workers > NODE_CPUS:
                parser.error(missing() or f"the test Slurm node runs at most {NODE_CPUS} ranks")
            config = Path(tmp) / "jupyter-config"
            config.mkdir()
            (config / "jupyter_mlcluster_config.json").write_text(
                '{"MLClusterConfig": {"slurm_poll_interval": 0.2}}'
            )
            os.environ["JUPYTER_CONFIG_DIR"] = str(config)
            os.environ["MLCLUSTER_BACKEND"] = "slurm"
            cluster = SlurmCluster(Path(tmp) / "slurm")
            cluster.start()
            os.environ["SLURM_CONF"] = str(cluster.conf)
        emulator = None
        if args.backend == "kubernetes":
            emulator = _start_emulator(Path(tmp))
        try:
            bench_stacks(args.workers, args.runs)
            bench_stall(args.workers, args.stall_after)
        finally:
            if cluster is not None:
                cluster.stop()
            if emulator is not None:
                PLAYER[0].stop_all()
                emulator.thread.stop()


def _start_emulator(tmp: Path):
    """The API emulator (its pod logs are written in its process: a thread of this one),
    this process's jobs going to it."""
    import json

    sys.path[:0] = [str(REPO / "tests")]
    from tests.kube.fixtures import start_cluster
    from tests.kube.player import ClusterPlayer

    os.environ["KUBECONFIG"] = str(tmp / "kubeconfig.yaml")
    os.environ["JUPYTER_CONFIG_DIR"] = str(tmp / "jupyter-config")
    os.environ["MLCLUSTER_BACKEND"] = "kubernetes"
    os.environ["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(REPO), os.environ.get("PYTHONPATH")])
    )
    settings = {"kubernetes_namespace": "bench", "kubernetes_image": "registry.example.com/nb:1"}
    (tmp / "jupyter-config").mkdir()
    (tmp / "jupyter-config" / "jupyter_mlcluster_config.json").write_text(
        json.dumps({"MLClusterConfig": settings})
    )
    emulator = start_cluster(Path(os.environ["KUBECONFIG"]))
    emulator.kube.create_namespace("bench")
    PLAYER.append(ClusterPlayer(emulator.kube, "bench", tmp / "node"))
    return emulator


if __name__ == "__main__":
    main()
