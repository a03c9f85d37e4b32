"""kill -9 at random (seeded) moments of the parts that run jobs and notebooks, and the
figures that must stay zero afterwards. Shared by tests/faults/test_kill9.py (a few rounds
per target) and bench/bench_kill9.py (the long randomised version).

Every rank of every job here starts two `sleep` grandchildren, one in its own process group
and one that escapes into a session of its own, writes their pids to a file, prints
numbered lines, and exits 0. After each fault the figures are:

- orphans: live processes of the round's jobs (supervisor, ranks, the recorded grandchildren,
  and anything whose environment names one of the jobs) once the jobs are final;
- stuck: jobs not final within a generous bound;
- lost: lines missing from the log of a rank the store calls succeeded;
- duplicates: (controller) objects beyond one of each kind per Notebook.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
from helpers import WAIT_SCALE

from jupyterlab_mlcluster.jobs.model import JobSpec, RankState
from jupyterlab_mlcluster.jobs.running import proctree
from jupyterlab_mlcluster.jobs.running.processes import process_is
from jupyterlab_mlcluster.runtime.payload import Payload

RANK_CODE = """\
import os, subprocess, time
rank = int(os.environ["RANK"])
kids = [subprocess.Popen(["sleep", "300"]),
        subprocess.Popen(["sleep", "300"], start_new_session=True)]
with open(os.path.join({piddir!r}, os.environ["MLCLUSTER_JOB_ID"] + "-" + str(rank)), "w") as f:
    f.write(" ".join(str(k.pid) for k in kids))
for i in range({lines}):
    print(f"rank {{rank}} line {{i}}", flush=True)
    time.sleep({pause})
"""
# Convergence bounds, not timings: a passing round never waits for them (stretched by
# MLCLUSTER_TEST_WAIT_SCALE on a loaded machine).
STUCK_AFTER = 30.0 * WAIT_SCALE  # for a job to become final after its fault
CLEANUP_GRACE = 2.0 * WAIT_SCALE  # for SIGKILLed processes to be gone once their job is final


@dataclass
class Tally:
    target: str
    rounds: int = 0
    injected: int = 0  # kill -9s that hit a live process
    survived: int = 0  # rounds with every figure zero
    jobs: int = 0
    orphans: int = 0
    stuck: int = 0
    lost: int = 0
    duplicates: int = 0
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)

    @property
    def bad(self) -> int:
        return self.orphans + self.stuck + self.lost + self.duplicates

    def row(self) -> str:
        return (
            f"{self.target:<17} {self.rounds:>6} {self.injected:>8} {self.survived:>8} "
            f"{self.jobs:>5} {self.orphans:>7} {self.stuck:>5} {self.lost:>5} "
            f"{self.duplicates:>10} {self.seconds:>7.1f}"
        )


HEADER = (
    f"{'target':<17} {'rounds':>6} {'injected':>8} {'survived':>8} {'jobs':>5} "
    f"{'orphans':>7} {'stuck':>5} {'lost':>5} {'duplicates':>10} {'seconds':>7}"
)


def rank_code(piddir: Path, lines: int, pause: float = 0.02) -> str:
    return RANK_CODE.format(piddir=str(piddir), lines=lines, pause=pause)


def submit(service, piddir: Path, lines: int, workers: int = 2) -> str:
    spec = JobSpec.from_options({"workers": workers})
    return service.submit(spec, Payload(source=rank_code(piddir, lines))).id


def kill9(pid: int | None, started: float | None = None) -> bool:
    """SIGKILL the process if it is still the one meant; True if it was hit."""
    if not pid or not process_is(pid, started):
        return False
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return False
    return True


def _live(proc: psutil.Process) -> bool:
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def job_leftovers(service, job_ids: list[str], piddir: Path) -> list[str]:
    """What of these jobs still lives (described), found without the product's own
    bookkeeping where possible: pid files the ranks wrote, and the environment."""
    ids = set(job_ids)
    left: list[str] = []
    seen: set[int] = set()
    for job_id in job_ids:
        record = service.store.get_job(job_id)
        sup = record.supervisor or {}
        if process_is(sup.get("pid"), sup.get("create_time")):
            left.append(f"{job_id} supervisor {sup['pid']}")
        for rank, pid, started in service.store.rank_processes(job_id):
            if process_is(pid, started):
                left.append(f"{job_id} rank {rank} pid {pid}")
        for pidfile in piddir.glob(f"{job_id}-*"):
            for pid in pidfile.read_text().split():
                with contextlib.suppress(psutil.Error):
                    proc = psutil.Process(int(pid))
                    if _live(proc) and proc.environ().get("MLCLUSTER_JOB_ID") == job_id:
                        seen.add(proc.pid)
                        left.append(f"{job_id} grandchild {pid} {proc.cmdline()}")
    for job_id in job_ids:  # the job's cgroup (made beside this process's own) is removed
        cgroup = proctree.job_cgroup_path(job_id)
        if cgroup is not None and cgroup.exists():
            left.append(f"{job_id} cgroup {cgroup}")
    me = os.getuid()
    for proc in psutil.process_iter(["pid", "uids"]):
        if not proc.info["uids"] or proc.info["uids"].real != me:
            continue
        with contextlib.suppress(psutil.Error):
            job = proc.environ().get("MLCLUSTER_JOB_ID")
            if job in ids and proc.pid not in seen and _live(proc):
                left.append(f"{job} marked {proc.pid} {proc.cmdline()}")
    return left


def lost_lines(service, job_id: str, lines: int) -> int:
    """Lines missing from the logs of this job's ranks that the store calls succeeded."""
    record = service.store.get_job(job_id)
    got, _ = service.logs(job_id)
    lost = 0
    for rank in record.ranks:
        if rank.state != RankState.SUCCEEDED:
            continue
        seen = {
            entry["line"]
            for entry in got
            if entry["rank"] == rank.rank and entry["stream"] == "stdout"
        }
        lost += sum(f"rank {rank.rank} line {i}" not in seen for i in range(lines))
    return lost


def settle(service, tally: Tally, jobs: dict[str, int], piddir: Path) -> bool:
    """Wait for the round's jobs to be final and clean; add its figures. True: all zero."""
    bad_before = tally.bad
    for job_id in jobs:
        record = service.wait(job_id, timeout=STUCK_AFTER)
        tally.jobs += 1
        if not record.final:
            tally.stuck += 1
            tally.notes.append(f"{job_id} stuck {record.state.value}")
    deadline = time.monotonic() + CLEANUP_GRACE
    while (left := job_leftovers(service, list(jobs), piddir)) and time.monotonic() < deadline:
        time.sleep(0.1)
    tally.orphans += len(left)
    tally.notes.extend(left)
    for job_id, lines in jobs.items():
        lost = lost_lines(service, job_id, lines)
        tally.lost += lost
        if lost:
            tally.notes.append(f"{job_id}: {lost} lines lost")
    return tally.bad == bad_before


def _at(start: float, delay: float) -> None:
    time.sleep(max(0.0, start + delay - time.monotonic()))


def _wait_claimed(service, job_id: str, timeout: float = 20.0) -> dict[str, Any]:
    timeout *= WAIT_SCALE
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        record = service.store.get_job(job_id)
        if record.supervisor or record.final:
            return record.supervisor or {}
        time.sleep(0.02)
    return {}


# -- targets ---------------------------------------------------------------------------------


def supervisor_rounds(service, rng: random.Random, rounds: int, piddir: Path, batch: int = 3):
    """Jobs in batches; each job's supervisor is SIGKILLed at its own random moment after it
    claimed the job (admission, rank start, running, finishing, or already done)."""
    tally = Tally("supervisor")
    began = time.monotonic()
    while tally.rounds < rounds:
        n = min(batch, rounds - tally.rounds)
        jobs: dict[str, int] = {}
        for _job in range(n):
            lines = rng.randint(2, 60)
            jobs[submit(service, piddir, lines)] = lines
        start = time.monotonic()
        for delay, job_id in sorted((rng.uniform(0.0, 1.2), j) for j in jobs):
            sup = _wait_claimed(service, job_id)
            _at(start, delay)
            tally.injected += kill9(sup.get("pid"), sup.get("create_time"))
        ok = settle(service, tally, jobs, piddir)
        tally.rounds += n
        tally.survived += n if ok else 0
    tally.seconds = time.monotonic() - began
    return tally


def zygote_rounds(service, rng: random.Random, rounds: int, piddir: Path):
    """The warm pool's zygote is SIGKILLed at a random moment while two jobs are submitted
    around it (forked warm before, started cold or from a new zygote after)."""
    from jupyterlab_mlcluster.jobs import warm

    tally = Tally("zygote")
    began = time.monotonic()
    for _ in range(rounds):
        warm.ensure_zygote(service.config)
        info = warm.status(service.config) or {}
        zygote = info.get("pid")
        started = psutil.Process(zygote).create_time() if zygote else None
        kill_at = rng.uniform(0.0, 1.0)
        jobs: dict[str, int] = {}
        start = time.monotonic()
        killed = False
        for delay in sorted(rng.uniform(0.0, 1.0) for _ in range(2)):
            if not killed and kill_at <= delay:
                _at(start, kill_at)
                tally.injected += kill9(zygote, started)
                killed = True
            _at(start, delay)
            lines = rng.randint(2, 30)
            jobs[submit(service, piddir, lines)] = lines
        if not killed:
            _at(start, kill_at)
            tally.injected += kill9(zygote, started)
        if zygote:
            psutil.wait_procs([psutil.Process(zygote)] if psutil.pid_exists(zygote) else [], 5)
        ok = settle(service, tally, jobs, piddir)
        tally.rounds += 1
        tally.survived += ok
    tally.seconds = time.monotonic() - began
    return tally


def kernel_rounds(service, rng: random.Random, rounds: int, piddir: Path, env: dict[str, str]):
    """A real kernel runs a `%%distributed` cell; the kernel is SIGKILLed at a random moment
    after it submitted the job (the job is attached to it: cancelled, or already done)."""
    from helpers import start_kernel

    tally = Tally("kernel")
    began = time.monotonic()
    for _ in range(rounds):
        km, kc = start_kernel(kernel_name="python3", env=env)
        try:
            kc.wait_for_ready(timeout=60)  # %%distributed is loaded with the kernel
            before = {r.id for r in service.store.list_jobs()[0]}
            lines = rng.randint(5, 60)
            kc.execute("%%distributed --workers 2\n" + rank_code(piddir, lines))
            job_id = _wait_new_job(service, before)
            _wait_claimed(service, job_id)
            time.sleep(rng.uniform(0.0, 1.5))
            pid = km.provisioner.process.pid
            tally.injected += kill9(pid)
            with contextlib.suppress(Exception):
                km.provisioner.process.wait(10)
        finally:
            kc.stop_channels()
            with contextlib.suppress(Exception):
                km.shutdown_kernel(now=True)
        ok = settle(service, tally, {job_id: lines}, piddir)
        tally.rounds += 1
        tally.survived += ok
    tally.seconds = time.monotonic() - began
    return tally


def _wait_new_job(service, before: set[str], timeout: float = 20.0) -> str:
    timeout *= WAIT_SCALE
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        new = [r.id for r in service.store.list_jobs()[0] if r.id not in before]
        if new:
            return new[0]
        time.sleep(0.02)
    raise AssertionError("the kernel submitted no job")


def server_rounds(
    service, rng: random.Random, rounds: int, piddir: Path, start_server: Callable[[], Any]
):
    """A real `jupyter server` takes two jobs over REST and is SIGKILLed at a random moment
    (while they are submitted, start or run). Jobs outlive the server by design and end."""
    tally = Tally("server")
    began = time.monotonic()
    for _ in range(rounds):
        server = start_server()
        jobs: dict[str, int] = {}
        kill_at = rng.uniform(0.0, 1.5)
        start = time.monotonic()
        try:
            for _job in range(2):
                if time.monotonic() - start >= kill_at:
                    break
                lines = rng.randint(2, 40)
                status, body = server.request(
                    "POST", "jobs", {"code": rank_code(piddir, lines), "workers": 2}
                )
                if status == 201:
                    jobs[body["id"]] = lines
            _at(start, kill_at)
            tally.injected += kill9(server.proc.pid)
            server.proc.wait(30)
        finally:
            server.stop()
        ok = settle(service, tally, jobs, piddir)
        tally.rounds += 1
        tally.survived += ok
    tally.seconds = time.monotonic() - began
    return tally


def controller_rounds(
    kube,
    namespace: str,
    rng: random.Random,
    rounds: int,
    log: Path,
    seconds: float | None = None,
):
    """The notebook-controller (`mlcluster controller`'s code, a real process) is SIGKILLed at
    a random moment while two Notebooks are created, then started again; each Notebook must
    converge to exactly one object of each kind."""
    from notebook_controller import objects
    from tests.kube.controller_process import ControllerZygote
    from tests.kube.controller_support import OWNED, create_notebook, notebook_status

    argv = [
        f"--namespace={namespace}",
        "--no-culling",
        "--log-level=WARNING",
        "--ControllerConfig.retry_delay=0.5",
        "--ControllerConfig.mirror_events=False",
    ]
    tally = Tally("controller")
    began = time.monotonic()
    zygote = ControllerZygote()
    try:
        pid = zygote.spawn(argv, log)
        for round_ in range(rounds):
            if seconds is not None and time.monotonic() - began > seconds:
                break
            names = [f"r{round_}-nb{i}" for i in range(2)]
            start = time.monotonic()
            kill_at = rng.uniform(0.0, 1.5)
            for name in names:
                create_notebook(kube, namespace, name=name, workspace=None)
                time.sleep(rng.uniform(0.0, 0.3))
            _at(start, kill_at)
            tally.injected += ControllerZygote.alive(pid)
            zygote.kill(pid)
            pid = zygote.spawn(argv, log)

            def counts(name: str) -> dict[str, int]:
                found = {}
                for api_version, kind in OWNED:
                    with contextlib.suppress(Exception):
                        found[kind] = len(
                            kube.list(
                                api_version,
                                kind,
                                namespace,
                                label_selector=f"{objects.LABEL_NOTEBOOK}={name}",
                            )
                        )
                return found

            def converged(names: list[str] = names) -> bool:
                return all(
                    sum(1 for c in counts(n).values() if c) == 4
                    and notebook_status(kube, namespace, n).get("phase")
                    for n in names
                )

            ok = True
            try:
                kube.wait_for(converged, timeout=STUCK_AFTER, interval=0.2)
            except Exception:  # noqa: BLE001 - a figure, not an error
                tally.stuck += 1
                ok = False
            for name in names:
                extra = sum(max(0, c - 1) for c in counts(name).values())
                tally.duplicates += extra
                ok = ok and not extra
            tally.rounds += 1
            tally.survived += ok
            tally.jobs += len(names)
    finally:
        zygote.close()
    tally.seconds = time.monotonic() - began
    return tally


def lonely_supervisor_rounds(service, rounds: int, piddir: Path, within: float = 2.0):
    """kill -9 of a running job's supervisor with no other mlcluster process to notice:
    this process only reads the store and /proc (no reaping call of the service). Every
    round, everything the ranks started must be gone within `within` seconds, and the job
    final soon after. Returns the tally and the slowest round's seconds to zero."""
    tally = Tally("supervisor-alone")
    slowest = 0.0
    began = time.monotonic()
    for _ in range(rounds):
        job_id = submit(service, piddir, 10**6, workers=2)
        deadline = time.monotonic() + 60 * WAIT_SCALE
        while len(list(piddir.glob(f"{job_id}-*"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        sup = service.store.get_job(job_id).supervisor or {}
        tally.injected += kill9(sup.get("pid"), sup.get("create_time"))
        killed = time.monotonic()
        while (left := job_leftovers(service, [job_id], piddir)) and (
            time.monotonic() - killed < within
        ):
            time.sleep(0.02)
        took = time.monotonic() - killed
        slowest = max(slowest, took)
        tally.rounds += 1
        tally.jobs += 1
        tally.orphans += len(left)
        tally.notes.extend(left)
        end = time.monotonic() + STUCK_AFTER
        while not service.store.get_job(job_id).final and time.monotonic() < end:
            time.sleep(0.05)
        if not service.store.get_job(job_id).final:
            tally.stuck += 1
            tally.notes.append(f"{job_id} stuck {service.store.get_job(job_id).state.value}")
        tally.survived += not left and service.store.get_job(job_id).final
    tally.seconds = time.monotonic() - began
    return tally, slowest
