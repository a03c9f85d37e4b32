"""What supervising many Kubernetes jobs at once costs, against the API emulator (tests/kube).

    python bench/bench_k8s_fleet.py [--jobs 100] [--extra 10] [--window 30] [--workers 2]

N jobs of 2 ranks (the Indexed Job engine) are submitted through JobService and left waiting:
their objects are created and resumed, and their pods created as the Job controller would,
but nobody schedules the pods. While they wait, measured:
  memory      - USS and RSS summed over every process that supervises those jobs (the distinct
                supervisor identities the store records per job, and their descendants); the
                zygote they were forked from is shown apart
  CPU         - the supervising processes' CPU time over --window seconds, as % of one core
  API         - requests per second the emulator receives over that window (its own counter,
                read in its process), and the watches open on it
Then, with the N waiting:
  ready       - submit -> every object created (the job object resumed, as bench_k8s.py's
                "ready") for M more jobs, one after another: p50 / p95
  cancel      - one of the N: cancel requested -> the job final, and -> its objects gone
First, with `--per-job` jobs, each with a supervisor process of its own (as before issue 34),
then with the N in one fleet (jobs/running/fleet.py), the same measures in the same run.
Everything is cancelled and stopped at the end (the jobs, the warm pool, the emulator), and the
supervising processes are checked to be gone (a fleet exits when idle for 30 s). The targets of issue 34 (1,000 jobs) are shown
beside the figures, and the per-job figures extrapolated to 1,000.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "bench"), str(REPO / "tests")]

from bench_k8s import NAMESPACE, JobWatch, isolated_environment, percentile

TARGET_JOBS = 1000
TARGET_MIB = 300.0  # supervision of 1,000 jobs, in total
TARGET_CPU = 5.0  # % of one core while they wait
TARGET_READY_MS = 200.0  # submit -> objects created, p50, with 1,000 running
TARGET_CANCEL_S = 1.0
MIB = 2**20

# The emulator in a process of its own (its work must not compete with what is measured for
# this process's GIL); a line "stats" on its stdin answers with its request counter and the
# number of open watches, a line of JSON [[namespace, pod, text], ...] appends those
# containers' output (as a container runtime writes it) and answers {}; end of input stops it.
SERVE_EMULATOR = """
import json, sys
from pathlib import Path
from tests.kube.fixtures import start_cluster
cluster = start_cluster(Path(sys.argv[1]))
print(cluster.url, flush=True)
def stats(emulator):
    return {"requests": emulator._request_count, "watches": len(emulator._store.watchers)}
def output(lines):
    async def append(emulator):
        for namespace, pod, text in lines:
            await emulator.append_log(namespace, pod, text, None)
        return {}
    return append
for line in sys.stdin:
    call = output(json.loads(line)) if line.startswith("[") else stats
    print(json.dumps(cluster.thread.call(call, timeout=600)), flush=True)  # (a busy loop)
cluster.thread.stop()
"""


class Emulator:
    def __init__(self, kubeconfig: str) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-c", SERVE_EMULATOR, kubeconfig],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=REPO,
        )
        assert self.process.stdout is not None
        self.url = self.process.stdout.readline().strip()
        if not self.url:
            raise RuntimeError("the emulator did not start")

    def stats(self) -> dict[str, int]:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write("stats\n")
        self.process.stdin.flush()
        return json.loads(self.process.stdout.readline())

    def append_logs(self, lines: list[tuple[str, str, str]]) -> None:
        """[(namespace, pod, text)]: what those containers write."""
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(json.dumps(lines) + "\n")
        self.process.stdin.flush()
        self.process.stdout.readline()

    def stop(self) -> None:
        self.process.communicate("", timeout=60)


def configure(root: Path, pool_modules: list[str] | None) -> None:
    settings: dict[str, Any] = {
        "kubernetes_namespace": NAMESPACE,
        "kubernetes_image": "registry.example.com/notebook:1",
        "warm_pool": True,
    }
    if pool_modules is not None:
        settings["warm_pool_modules"] = pool_modules
    config_dir = root / "jupyter-config"
    config_dir.mkdir(parents=True, exist_ok=True)
    (config_dir / "jupyter_mlcluster_config.json").write_text(
        json.dumps({"MLClusterConfig": settings})
    )


def supervising_processes(service: Any, job_ids: list[str]) -> list[psutil.Process]:
    """The distinct processes the store names as the jobs' supervisors, and their descendants."""
    found: dict[int, psutil.Process] = {}
    for job_id in job_ids:
        identity = service.store.get_job(job_id).supervisor or {}
        try:
            proc = psutil.Process(identity["pid"])
            if abs(proc.create_time() - identity["create_time"]) > 1:
                continue  # the pid was reused
        except (KeyError, psutil.NoSuchProcess):
            continue
        for p in [proc, *proc.children(recursive=True)]:
            found.setdefault(p.pid, p)
    return list(found.values())


def memory(procs: list[psutil.Process]) -> tuple[int, int]:
    uss = rss = 0
    for p in procs:
        try:
            info = p.memory_full_info()
        except psutil.NoSuchProcess:
            continue
        uss += info.uss
        rss += info.rss
    return uss, rss


def cpu_seconds(procs: list[psutil.Process]) -> dict[int, float]:
    out = {}
    for p in procs:
        try:
            t = p.cpu_times()
        except psutil.NoSuchProcess:
            continue
        out[p.pid] = t.user + t.system
    return out


def wait_for(predicate: Any, timeout: float, what: str, interval: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} within {timeout}s")
        time.sleep(interval)


def submit(service: Any, workers: int) -> tuple[str, float, float]:
    """(job id, when submit was called, how long it took to return)"""
    from jupyterlab_mlcluster.jobs.model import JobSpec
    from jupyterlab_mlcluster.runtime.payload import Payload

    spec = JobSpec.from_options({"backend": "kubernetes", "workers": workers})
    t0 = time.perf_counter()
    record = service.submit(spec, Payload(kind="code", source="print('hi')"))
    return record.id, t0, time.perf_counter() - t0


def p50_p95(values: list[float]) -> str:
    return (
        f"p50 {statistics.median(values) * 1000:.0f} ms,"
        f" p95 {percentile(values, 0.95) * 1000:.0f} ms"
    )


def measure(
    service: Any, args: argparse.Namespace, n: int, env: dict[str, Any]
) -> tuple[list[tuple[str, str, str]], str]:
    """One phase: `n` jobs left waiting, measured, then `args.extra` more and a cancel.
    (the table's rows, the extrapolation line)"""
    from tests.kube.player import objects_of

    emulator, kube, player, watch = env["emulator"], env["kube"], env["player"], env["watch"]
    jobs: list[str] = env["jobs"]
    seen: dict[int, psutil.Process] = env["seen"]
    own_watches = emulator.stats()["watches"]  # the benchmark's own, and an earlier phase's
    t_start = time.monotonic()
    first_ready: list[float] = []  # the N, while they are being submitted
    submitted: dict[str, float] = {}
    mine: list[str] = []
    for i in range(n):
        job_id, submitted[job_id], _ = submit(service, args.workers)
        mine.append(job_id)
        jobs.append(job_id)
        if (i + 1) % 100 == 0:
            print(f"  submitted {i + 1}/{n}", file=sys.stderr, flush=True)
    for job_id in mine:
        first_ready.append(
            watch.wait_ready(job_id, timeout=max(300.0, 5.0 * n))[1] - submitted[job_id]
        )
        # pending: nobody schedules them
        env["pods"][job_id] = player.create_pods(player.job_object(job_id))
    wait_for(
        lambda: all(service.store.get_job(j).supervisor for j in mine),
        120,
        "every job claimed by a supervisor",
    )
    t_waiting = time.monotonic() - t_start
    print(f"  {n} jobs waiting after {t_waiting:.1f} s", file=sys.stderr, flush=True)
    time.sleep(3)  # let the supervisors see their pods (their first reaction is not waiting)

    procs = supervising_processes(service, mine)
    seen.update((p.pid, p) for p in procs)
    zygotes = {p.ppid() for p in procs} - {p.pid for p in procs}
    zygotes = {
        z
        for z in zygotes
        if psutil.pid_exists(z) and "zygote" in " ".join(psutil.Process(z).cmdline())
    }
    zygote_uss, zygote_rss = memory([psutil.Process(z) for z in zygotes])
    em_proc = psutil.Process(emulator.process.pid)
    cpu0, em_cpu0, api0 = cpu_seconds(procs), cpu_seconds([em_proc]), emulator.stats()
    t0 = time.monotonic()
    time.sleep(args.window)
    cpu1, em_cpu1, api1 = cpu_seconds(procs), cpu_seconds([em_proc]), emulator.stats()
    elapsed = time.monotonic() - t0
    uss, rss = memory(procs)  # after the window: what they hold once settled
    cpu = sum(cpu1[pid] - cpu0[pid] for pid in cpu1 if pid in cpu0) / elapsed * 100
    em_cpu = sum(em_cpu1.values()) - sum(em_cpu0.values())
    rps = (api1["requests"] - api0["requests"]) / elapsed
    watches = api1["watches"] - own_watches

    ready: list[float] = []
    returned: list[float] = []
    for _ in range(args.extra):
        job_id, t_submit, took = submit(service, args.workers)
        jobs.append(job_id)
        mine.append(job_id)
        returned.append(took)
        ready.append(watch.wait_ready(job_id, timeout=120)[1] - t_submit)
    seen.update((p.pid, p) for p in supervising_processes(service, mine))

    victim = mine[n // 2]
    t_cancel = time.perf_counter()
    record = service.cancel(victim, wait=True)
    t_final = time.perf_counter()
    wait_for(lambda: not objects_of(kube, NAMESPACE, victim), 60, "the objects deleted")
    t_gone = time.perf_counter()
    assert record is not None and record.final, record

    per_uss, per_rss = uss / n, rss / n
    zygote = f"zygote {zygote_uss / MIB:.0f} MiB USS" if zygotes else "started cold, no zygote"
    rows = [
        ("supervising processes", f"{len(procs)} for {n} jobs", zygote),
        (
            "supervision USS (sum)",
            f"{uss / MIB:.1f} MiB ({per_uss / MIB:.2f} MiB/job)",
            f"<= {TARGET_MIB:.0f} MiB at {TARGET_JOBS}",
        ),
        ("supervision RSS (sum)", f"{rss / MIB:.1f} MiB ({per_rss / MIB:.2f} MiB/job)", ""),
        (
            f"supervision CPU, {elapsed:.0f} s waiting",
            f"{cpu:.1f} % of a core ({cpu / n:.3f} %/job)",
            f"<= {TARGET_CPU:.0f} % at {TARGET_JOBS}",
        ),
        (
            "API requests while waiting",
            f"{rps:.1f} /s ({rps / n:.2f} /s/job)",
            f"emulator CPU {em_cpu / elapsed * 100:.1f} %",
        ),
        ("watches open on the API", f"{watches} ({watches / n:.2f}/job)", ""),
        (
            f"submit -> objects created, {args.extra} more",
            p50_p95(ready),
            f"p50 <= {TARGET_READY_MS:.0f} ms at {TARGET_JOBS}",
        ),
        (f"  submit() returned, {args.extra} more", p50_p95(returned), ""),
        (f"  objects created, the first {n}", p50_p95(first_ready), "(submitted in a row)"),
        (
            "cancel one job",
            f"final {t_final - t_cancel:.2f} s, objects gone {t_gone - t_cancel:.2f} s",
            f"<= {TARGET_CANCEL_S:.0f} s",
        ),
    ]
    extrapolated = (
        f"extrapolated to {TARGET_JOBS} jobs from the per-job figures:"
        f" USS {per_uss * TARGET_JOBS / 2**30:.2f} GiB, RSS {per_rss * TARGET_JOBS / 2**30:.2f}"
        f" GiB, CPU {cpu / n * TARGET_JOBS:.0f} % of a core,"
        f" {rps / n * TARGET_JOBS:.0f} API requests/s,"
        f" {watches / n * TARGET_JOBS:.0f} watches"
    )
    return rows, extrapolated


def kill9(
    service: Any, env: dict[str, Any], running: list[str], lines: int
) -> list[tuple[str, str]]:
    """`running` jobs' pods run and write `lines` numbered lines a rank; the fleet is killed
    with -9 halfway, the rest written while none follows them. A reaper's turn every second
    (as the server's event watcher takes one) starts the next fleet, which must adopt every
    unfinished job and store each line exactly once, in order. (the table's rows)"""
    import signal
    import threading

    from jupyterlab_mlcluster.jobs.model import JobState

    kube, emulator, pods = env["kube"], env["emulator"], env["pods"]
    unfinished = [j for j in env["jobs"] if not service.store.get_job(j).final]
    print(f"  kill -9: {len(running)} jobs run", file=sys.stderr, flush=True)
    for job_id in running:
        for pod in pods[job_id].values():
            kube.set_pod_phase(NAMESPACE, pod, "Running")

    def write(part: range) -> None:
        for job_id in running:
            emulator.append_logs(
                [
                    (NAMESPACE, pod, "".join(f"{i}\n" for i in part))
                    for rank, pod in pods[job_id].items()
                ]
            )

    def stored(job_id: str) -> list[str]:
        got, _ = service.logs(job_id)
        return [f"{item['rank']}:{item['line']}" for item in got if item["stream"] != "system"]

    def expected(job_id: str, upto: int) -> list[str]:
        return sorted(f"{rank}:{i}" for rank in pods[job_id] for i in range(upto))

    half = lines // 2
    write(range(half))
    wait_for(
        lambda: all(len(stored(j)) >= len(expected(j, half)) for j in running),
        300,
        "the first half of the lines stored",
    )
    holders = {service.store.get_job(j).supervisor["pid"] for j in unfinished}
    assert len(holders) == 1, f"not one fleet: {holders}"
    (fleet,) = holders
    t_kill = time.monotonic()
    os.kill(fleet, signal.SIGKILL)
    write(range(half, lines))  # while no fleet follows them
    stop = threading.Event()

    def server_reaper() -> None:
        while not stop.wait(1.0):
            service.reap()

    reaper = threading.Thread(target=server_reaper, daemon=True)
    reaper.start()
    try:

        def adopted() -> bool:
            found = {(service.store.get_job(j).supervisor or {}).get("pid") for j in unfinished}
            return len(found) == 1 and found != {fleet} and None not in found

        wait_for(adopted, 300, "a new fleet holding every unfinished job", interval=0.2)
        t_adopted = time.monotonic()

        def followed(job_id: str) -> bool:  # (its objects adopted, its pods' logs read again)
            got, _ = service.logs(job_id)
            return any("following" in i["line"] for i in got if i["stream"] == "system")

        wait_for(lambda: all(followed(j) for j in running), 300, "every job followed", 0.2)
        t_followed = time.monotonic()
        wait_for(
            lambda: all(len(stored(j)) >= len(expected(j, lines)) for j in running),
            300,
            "every line stored",
            interval=0.2,
        )
        t_complete = time.monotonic()
    finally:
        stop.set()
        reaper.join()
    lost = twice = disordered = 0
    for job_id in running:
        got = stored(job_id)
        want = expected(job_id, lines)
        lost += len(set(want) - set(got))
        twice += len(got) - len(set(got))
        for rank in pods[job_id]:
            mine = [int(line.split(":")[1]) for line in got if line.startswith(f"{rank}:")]
            disordered += mine != sorted(mine)
        assert service.store.get_job(job_id).state == JobState.RUNNING
    written = sum(len(expected(j, lines)) for j in running)
    return [
        (
            f"kill -9 of the fleet, {len(running)} jobs writing",
            f"{len(unfinished)} jobs claimed by the next fleet in {t_adopted - t_kill:.1f} s,"
            f" the running ones followed again in {t_followed - t_kill:.1f} s;"
            f" every line stored {t_complete - t_kill:.1f} s after the kill",
        ),
        (
            "  their output",
            f"{written} lines written, lost {lost}, stored twice {twice},"
            f" out of order {disordered} ranks",
        ),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=100, help="jobs left waiting (N)")
    parser.add_argument("--extra", type=int, default=10, help="jobs submitted among them (M)")
    parser.add_argument("--window", type=float, default=30.0, help="seconds of the CPU window")
    parser.add_argument("--workers", type=int, default=2, help="ranks per job")
    parser.add_argument(
        "--per-job",
        type=int,
        default=20,
        help="first, this many jobs with a supervisor process each (supervise_together off,"
        " as before issue 34), measured the same way; 0: skip",
    )
    parser.add_argument(
        "--pool-modules",
        default=None,
        help="comma-separated warm_pool_modules (default: the setting's default, torch and"
        " numpy, what a server runs); the supervisors are forked from that generation",
    )
    parser.add_argument(
        "--kill9",
        type=int,
        default=50,
        help="then this many of the fleet's jobs run and write --lines lines a rank through a"
        " kill -9 of the fleet (half before, half while no fleet follows them): the next"
        " fleet must adopt every job and store every line once; 0: skip",
    )
    parser.add_argument("--lines", type=int, default=200, help="lines a rank writes (--kill9)")
    args = parser.parse_args()
    if args.jobs < 1 or args.extra < 1 or args.per_job < 0:
        parser.error("--jobs and --extra must be at least 1, --per-job at least 0")
    if not 0 <= args.kill9 <= args.jobs or args.lines < 2:
        parser.error("--kill9 must be between 0 and --jobs, --lines at least 2")

    root = isolated_environment("bench-k8s-fleet-")
    pool_modules = None if args.pool_modules is None else args.pool_modules.split(",")
    configure(root, pool_modules)
    emulator = Emulator(os.environ["KUBECONFIG"])

    import jupyterlab_mlcluster.backends  # noqa: F401 - fills the backend registry
    from jupyterlab_mlcluster.config import get_config
    from jupyterlab_mlcluster.jobs import warm
    from jupyterlab_mlcluster.jobs.service import JobService
    from tests.kube.helpers import Kube
    from tests.kube.player import ClusterPlayer

    kube = Kube(emulator.url)
    kube.create_namespace(NAMESPACE)
    env: dict[str, Any] = {
        "emulator": emulator,
        "kube": kube,
        "player": ClusterPlayer(kube, NAMESPACE, root / "player"),
        "watch": JobWatch(emulator.url, "batch/v1", "jobs"),
        "jobs": [],
        "seen": {},  # every supervising process met, to check at the end
        "pods": {},  # job id -> {rank: pod name}
    }
    phases = [("a supervisor process per job", args.per_job, False)] if args.per_job else []
    phases.append(("one fleet for all (issue 34)", args.jobs, True))
    services = []
    try:
        for label, n, together in phases:
            config = get_config()
            config.supervise_together = together
            service = JobService(config=config)
            services.append(service)
            rows, extrapolated = measure(service, args, n, env)
            width = max(len(r[0]) for r in rows)
            value_width = max(len(r[1]) for r in rows)
            modules = ",".join(config.warm_pool_modules) or "none"
            print(
                f"\nKubernetes supervision: {label}; {n} waiting jobs of {args.workers} ranks"
                f" (+{args.extra}), warm pool of {modules}\n"
            )
            print(f"{'':<{width}}  {'measured':<{value_width}}  target / aside")
            print("-" * (width + value_width + 40))
            for name, value, aside in rows:
                print(f"{name:<{width}}  {value:<{value_width}}  {aside}")
            print(f"\n{extrapolated}", flush=True)
            if together and args.kill9:
                for name, value in kill9(service, env, env["jobs"][: args.kill9], args.lines):
                    print(f"{name:<{width}}  {value}", flush=True)
            if together is False:  # the next phase measures the fleet alone
                cleanup(service, env["jobs"], env["seen"])
                env["jobs"].clear()
    finally:
        cleanup(services[-1] if services else JobService(), env["jobs"], env["seen"])
        warm.stop(get_config())  # the zygote this benchmark started
        emulator.stop()


def cleanup(service: Any, jobs: list[str], seen: dict[int, psutil.Process]) -> None:
    print("  cancelling every job", file=sys.stderr, flush=True)
    for job_id in jobs:
        try:
            service.cancel(job_id, wait=False)
        except Exception as exc:  # noqa: BLE001 - cancel the others whatever one does
            print(f"  cancel {job_id}: {exc}", file=sys.stderr)
    not_final = [j for j in jobs if not service.wait(j, timeout=60).final]
    if not_final:
        print(f"  NOT FINAL after cancel: {not_final}", file=sys.stderr)
    gone_by = time.monotonic() + 45  # (an idle fleet exits after 30 s)
    while time.monotonic() < gone_by and any(p.is_running() for p in seen.values()):
        time.sleep(0.1)
    lingering = [p.pid for p in seen.values() if p.is_running()]
    if lingering:
        print(f"  supervisors still running 45 s after their jobs ended: {lingering}")


if __name__ == "__main__":
    main()
