"""The Kubernetes API server fails under a running job: outages, hangs, a 429 storm, deletes
that fail. Real supervisor processes, the API emulator behind a TCP proxy the test breaks
(`proxy.py`); the test plays the cluster's side directly. Each test prints its figures:
faults injected, what survived, what was lost (zero).
"""

from __future__ import annotations

import itertools
import random
import signal
import time
from collections import defaultdict

import pytest
from helpers import wait_for

from tests.faults.apifaults import (
    OUTAGE,
    cpu_seconds,
    files_size,
    random_rounds,
    start_ticker,
    supervisor_of,
    survives,
)
from tests.kube.player import objects_of

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("fault", ["refuse", "hang"])
def test_an_api_outage_mid_job_costs_little_and_loses_nothing(
    fault, k8s, player, kube, kube_namespace, proxy
):
    """Cut (connections refused, open watches and log streams reset) or hung (nothing
    answered, open streams stalled) for 20 s: the supervisor idles, writes little, and the
    job carries on when the server is back; cancel then deletes everything."""
    service = k8s()
    record = start_ticker(service, player)
    supervisor = supervisor_of(service, record.id)
    job_dir = service.store.job_dir(record.id)
    cpu_before, size_before = cpu_seconds(supervisor), files_size(job_dir)
    requests_before = len(proxy.requests)
    started = time.monotonic()
    proxy.set_mode(fault)
    time.sleep(OUTAGE)
    cut = time.monotonic() - started
    cpu = (cpu_seconds(supervisor) - cpu_before) / cut
    growth = files_size(job_dir) - size_before
    attempts = len(proxy.requests) - requests_before
    proxy.set_mode("pass")
    assert service.store.get_job(record.id).state == "running"
    outcome = survives(service, player, kube, kube_namespace, record.id)
    print(
        f"\n[faults] API {fault} for {cut:.1f}s: supervisor CPU {cpu:.1%} of a core, its files "
        f"+{growth / 1024:.1f} KiB, {attempts} requests reached the proxy meanwhile, {proxy.faults} "
        f"connections broken/refused by the proxy; the job still running; {outcome}"
    )
    assert cpu < 0.10, f"the supervisor used {cpu:.1%} of a core during the outage"
    assert growth < 256 * 1024, f"its files grew {growth} bytes during the outage"
    # Reconnects wait the backoff: a handful per loop, not thousands.
    assert attempts < 60, f"{attempts} requests during a {cut:.0f}s outage"


def test_a_429_storm_with_retry_after_is_obeyed(k8s, player, kube, kube_namespace, proxy):
    """Every request is answered 429 with Retry-After: 3 for 15 s: no client loop asks
    again sooner than it was told; the job carries on afterwards."""
    proxy.retry_after = 3
    service = k8s()
    record = start_ticker(service, player)
    started = time.monotonic()
    proxy.set_mode("throttle")
    time.sleep(15)
    proxy.set_mode("pass")
    ended = time.monotonic()
    storm = [r for r in proxy.requests if started <= r.at < ended]
    by_loop: dict[tuple[str, str], list[float]] = defaultdict(list)
    for seen in storm:
        by_loop[(seen.method, seen.path.split("?")[0])].append(seen.at)
    gaps = [b - a for times in by_loop.values() for a, b in itertools.pairwise(times)]
    outcome = survives(service, player, kube, kube_namespace, record.id)
    print(
        f"\n[faults] 429 storm for {ended - started:.1f}s (Retry-After 3): {len(storm)} requests "
        f"from {len(by_loop)} loops, shortest gap in a loop "
        f"{min(gaps, default=float('nan')):.2f}s; {outcome}"
    )
    assert storm, "the storm met no request at all"
    assert all(gap >= 2.9 for gap in gaps), sorted(gaps)[:5]
    assert len(storm) <= len(by_loop) * (15 // 3 + 1)


def test_a_delete_that_fails_is_retried_until_it_happens(
    k8s, player, kube, kube_namespace, proxy, monkeypatch
):
    """Deletes answered 503 (the policy's scale shortened by MLCLUSTER_KUBE_BACKOFF, its
    shape unchanged) until five have been refused, backing off in between: the supervisor
    keeps the job non-final and keeps trying; once deletes work, the objects go and the job
    ends cancelled."""
    monkeypatch.setenv("MLCLUSTER_KUBE_BACKOFF", "0.2,2")
    service = k8s()
    record = start_ticker(service, player)
    proxy.set_mode("fail_deletes")
    started = time.monotonic()
    service.cancel(record.id, wait=False)

    def most_tries_of_one_delete() -> int:
        tries: defaultdict[str, int] = defaultdict(int)
        for seen in list(proxy.requests):
            if seen.method == "DELETE" and seen.at >= started:
                tries[seen.path.split("?")[0]] += 1
        return max(tries.values(), default=0)

    # Waited for, not slept: one object's delete refused five times, backing off between
    # tries (0.2, 0.4, ... 2 s: seconds).
    wait_for(lambda: most_tries_of_one_delete() >= 5, timeout=60, message="a delete retried")
    assert not service.store.get_job(record.id).final, "final while its objects live on"
    refused = proxy.count(started, method="DELETE")
    failing_for = time.monotonic() - started
    proxy.set_mode("pass")
    final = service.wait(record.id, timeout=60)
    player.kill_deleted()
    assert final.state == "cancelled", (final.state, final.error)
    assert objects_of(kube, kube_namespace, record.id) == {}
    assert service.store.pending_cleanups() == []
    print(
        f"\n[faults] deletes failed for {failing_for:.1f}s: {refused} refused DELETEs, retried "
        "until one "
        f"worked; objects left: 0; pending cleanups: 0"
    )
    assert refused >= 5


def test_a_cleanup_left_by_a_killed_supervisor_is_finished_by_the_reaper(
    k8s, player, kube, kube_namespace, proxy, monkeypatch
):
    """The supervisor is killed (-9) while its deletes fail: the job records a pending
    cleanup, ends cancelled, and the reaper deletes the objects once the API server lets it."""
    monkeypatch.setenv("MLCLUSTER_KUBE_BACKOFF", "0.2,2")
    service = k8s()
    record = start_ticker(service, player)
    supervisor = supervisor_of(service, record.id)
    proxy.set_mode("fail_deletes")
    started = time.monotonic()
    service.cancel(record.id, wait=False)
    wait_for(
        lambda: proxy.count(started, method="DELETE") >= 2, timeout=30, message="deletes tried"
    )
    supervisor.send_signal(signal.SIGKILL)
    supervisor.wait(30)
    final = service.wait(record.id, timeout=30)  # the reaper settles it
    assert final.state == "cancelled"
    assert service.store.pending_cleanups() == [record.id]
    assert objects_of(kube, kube_namespace, record.id) != {}  # still there: deletes fail
    proxy.set_mode("pass")

    def reaped() -> bool:
        service.reap(force=True)
        return not service.store.pending_cleanups()

    wait_for(reaped, timeout=60, message="the pending cleanup completed by the reaper")
    player.kill_deleted()
    wait_for(lambda: objects_of(kube, kube_namespace, record.id) == {}, timeout=30)
    print(
        f"\n[faults] supervisor killed while {proxy.count(started, method='DELETE')} DELETEs "
        "failed: pending cleanup recorded, completed by the reaper; objects left: 0"
    )


def test_random_faults_in_a_row(k8s, player, kube, kube_namespace, proxy, monkeypatch):
    """Two rounds of bench/bench_api_faults.py's randomised version (faults of up to 4 s):
    what the bench runs for minutes, here short, so it cannot rot."""
    monkeypatch.setenv("MLCLUSTER_KUBE_BACKOFF", "0.2,2")
    tally = random_rounds(
        k8s(), player, kube, kube_namespace, proxy, random.Random(20261126), 2, longest=4.0
    )
    print(f"\n[faults] random rounds\n{tally.HEADER}\n{tally.row()}")
    assert tally.rounds == 2 and tally.bad == 0, (tally.row(), tally.notes)
    assert tally.max_cpu < 0.10 and tally.max_growth < 256 * 1024, tally.row()
