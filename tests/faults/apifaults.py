"""The Kubernetes API server failing under running jobs, and the figures that must hold
afterwards. Shared by tests/faults/test_kube_api_faults.py (one fault of each kind) and
bench/bench_api_faults.py (the long randomised version: `random_rounds`).

A job here is one rank printing numbered lines ("tick N") forever; the test plays the
cluster's side (`ClusterPlayer`) directly, the supervisor reaches the API server through a
`FaultProxy` the test breaks. After each round: the job carried on, cancel deleted every
object, no line was lost or duplicated.
"""

from __future__ import annotations

import random
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil
from helpers import wait_for

from tests.faults.proxy import FaultProxy
from tests.kube.jobs_fixtures import code, spec_of
from tests.kube.player import objects_of

OUTAGE = 20.0  # seconds the API server is cut (the longest fault of a random round)
TICKER = """
import time
i = 0
while True:
    print(f"tick {i}", flush=True)
    i += 1
    time.sleep(0.1)
"""
TICK = re.compile(r"^tick (\d+)$")


def ticks(service, job_id: str) -> list[int]:
    lines, _ = service.logs(job_id, 0)
    return [int(m.group(1)) for item in lines if (m := TICK.match(item["line"]))]


def files_size(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())


def start_ticker(service, player):
    record = service.submit(spec_of(workers=1), code(TICKER))
    job = player.resumed(record.id)
    (pod,) = player.create_pods(job).values()
    player.schedule(pod)
    player.run_rank(pod)
    wait_for(lambda: len(ticks(service, record.id)) >= 10, timeout=60, message="ticks stored")
    return record


def supervisor_of(service, job_id: str) -> psutil.Process:
    info = service.store.get_job(job_id).supervisor
    return psutil.Process(info["pid"])


def cpu_seconds(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


def carries_on(service, job_id: str) -> int:
    """New lines arrive after the fault: the job goes on; how many were stored by then."""
    before = len(ticks(service, job_id))
    try:
        wait_for(
            lambda: len(ticks(service, job_id)) >= before + 30,
            timeout=90,
            message="lines again after the fault",
        )
    except AssertionError:
        lines, _ = service.logs(job_id)
        system = [item["line"] for item in lines if item["stream"] == "system"]
        log = (service.store.job_dir(job_id) / "supervisor.log").read_text()[-3000:]
        pid = service.store.get_job(job_id).supervisor["pid"]
        threads = psutil.Process(pid).num_threads() if psutil.pid_exists(pid) else None
        raise AssertionError(
            f"no lines after the fault: {system}\n{log}\n{threads}\n"
            f"{service.store.get_job(job_id).to_json()}"
        ) from None
    return len(ticks(service, job_id))


def assert_nothing_lost(service, job_id: str) -> int:
    """Every line the rank printed up to the last one stored, once, in order."""
    seen = ticks(service, job_id)
    wrong = next((i for i, n in enumerate(seen) if n != i), None)
    lines, _ = service.logs(job_id, 0)
    assert wrong is None, (
        f"lines lost or duplicated from #{wrong}: {seen[max(0, (wrong or 0) - 3) : (wrong or 0) + 5]}"
        f" {[x['line'] for x in lines if not TICK.match(x['line'])]}"
    )
    return len(seen)


def cancel_and_check_gone(service, player, kube, namespace: str, job_id: str) -> None:
    final = service.cancel(job_id)
    player.kill_deleted()
    assert final.state == "cancelled", (final.state, final.error)
    assert objects_of(kube, namespace, job_id) == {}


def survives(service, player, kube, namespace: str, job_id: str) -> str:
    """After the fault the job carries on, is cancelled without leftovers and lost no line;
    the report's closing words."""
    stored = carries_on(service, job_id)
    cancel_and_check_gone(service, player, kube, namespace, job_id)
    kept = assert_nothing_lost(service, job_id)
    return f"survived: the job ({stored} lines, cancelled, 0 objects left); lost: 0 of {kept} lines"


FAULTS = ("refuse", "hang", "throttle", "fail_deletes")


@dataclass
class ApiTally:
    rounds: int = 0
    injected: int = 0  # faults set on the proxy
    broken: int = 0  # connections the proxy reset or refused, requests it answered 429/503
    survived: int = 0  # rounds whose job carried on, was cancelled clean and lost nothing
    lines: int = 0  # lines stored, all rounds
    lost: int = 0  # lines lost or duplicated
    left: int = 0  # objects left after cancel
    max_cpu: float = 0.0  # the supervisor's share of a core during a fault, at most
    max_growth: int = 0  # bytes its files grew during a fault, at most
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)

    HEADER = (
        f"{'rounds':>6} {'faults':>6} {'broken':>6} {'survived':>8} {'lines':>7} "
        f"{'lost':>4} {'left':>4} {'max CPU':>7} {'max growth':>10} {'seconds':>7}"
    )

    def row(self) -> str:
        return (
            f"{self.rounds:>6} {self.injected:>6} {self.broken:>6} {self.survived:>8} "
            f"{self.lines:>7} {self.lost:>4} {self.left:>4} {self.max_cpu:>7.1%} "
            f"{self.max_growth / 1024:>7.1f} KiB {self.seconds:>7.0f}"
        )

    @property
    def bad(self) -> int:
        return self.lost + self.left + (self.rounds - self.survived)


def random_rounds(
    service,
    player,
    kube,
    namespace: str,
    proxy: FaultProxy,
    rng: random.Random,
    rounds: int,
    seconds: float | None = None,
    longest: float = OUTAGE,
    failing_deletes: float | None = None,
) -> ApiTally:
    """Each round: a ticking job meets 1-3 faults of random kinds and lengths (up to
    `longest` s, with the API back in between), sometimes a cancel whose deletes fail for a
    while; then it must carry on, cancel clean and have lost nothing."""
    tally = ApiTally()
    began = time.monotonic()
    for _ in range(rounds):
        if seconds is not None and time.monotonic() - began > seconds:
            break
        record = start_ticker(service, player)
        supervisor = supervisor_of(service, record.id)
        job_dir = service.store.job_dir(record.id)
        broken_before = proxy.faults
        for _ in range(rng.randint(1, 3)):
            fault = rng.choice(FAULTS[:3])
            length = rng.uniform(1.0, longest)
            cpu, size = cpu_seconds(supervisor), files_size(job_dir)
            started = time.monotonic()
            proxy.set_mode(fault)
            tally.injected += 1
            time.sleep(length)
            cut = time.monotonic() - started
            tally.max_cpu = max(tally.max_cpu, (cpu_seconds(supervisor) - cpu) / cut)
            tally.max_growth = max(tally.max_growth, files_size(job_dir) - size)
            proxy.set_mode("pass")
            time.sleep(rng.uniform(0.5, 3.0))
        ok = True
        try:
            carries_on(service, record.id)
            if failing_deletes or rng.random() < 0.5:  # the cancel's deletes fail a while
                proxy.set_mode("fail_deletes")
                tally.injected += 1
                service.cancel(record.id, wait=False)
                time.sleep(failing_deletes or rng.uniform(1.0, longest))
                if service.store.get_job(record.id).final:
                    tally.notes.append(f"{record.id}: final while its deletes failed")
                    ok = False
                proxy.set_mode("pass")
            final = service.cancel(record.id)
            player.kill_deleted()
            left = wait_for(
                lambda rid=record.id: not objects_of(kube, namespace, rid) or None,
                timeout=60,
                message="objects gone",
            )
            ok = ok and final.state == "cancelled" and left
        except AssertionError as exc:
            tally.notes.append(f"{record.id}: {exc}")
            ok = False
        left = len(objects_of(kube, namespace, record.id))
        tally.left += left
        seen = ticks(service, record.id)
        wrong = sum(1 for i, n in enumerate(seen) if n != i)
        tally.lost += wrong
        tally.lines += len(seen)
        tally.broken += proxy.faults - broken_before
        tally.rounds += 1
        tally.survived += ok and not left and not wrong
    tally.seconds = time.monotonic() - began
    return tally
