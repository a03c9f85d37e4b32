"""The fleet's election and life (jobs/running/fleet.py), without a cluster: one fleet per
store and key, whoever asks; a fleet with no job lets go of its lock and exits; a lock left
by a fleet that died is taken over, one held by a live fleet is respected."""

from __future__ import annotations

import json
import os
import sys
import threading
import time

import psutil
import pytest
from helpers import wait_for

from jupyterlab_mlcluster.jobs.model import JobSpec, JobState
from jupyterlab_mlcluster.jobs.record import JobRecord
from jupyterlab_mlcluster.jobs.running.fleet import (
    FleetLock,
    FleetMember,
    SupervisorFleet,
    ensure_fleet,
    lock_path,
)
from jupyterlab_mlcluster.jobs.running.turns import ADOPTING_AT_ONCE
from jupyterlab_mlcluster.jobs.storage.store import JobStore

KEY = "kubernetes-0123456789abcdef"
LAUNCH = json.dumps({"fleet": KEY}).encode()


def fleets(store: JobStore) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmd = proc.info["cmdline"] or []
        if "jupyterlab_mlcluster.jobs.running.fleet" in cmd and str(store.root) in cmd:
            found.append(proc)
    return found


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.setenv("MLCLUSTER_FLEET_IDLE_EXIT", "3")
    store = JobStore(tmp_path / "store")
    yield store
    for proc in fleets(store):
        proc.kill()


def env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))


def test_one_fleet_however_many_ask_and_it_leaves_when_idle(store):
    assert ensure_fleet(store, "kubernetes", KEY, env()) is True
    # Asked again at once (the first still starting): the lock it was handed says no.
    assert [ensure_fleet(store, "kubernetes", KEY, env()) for _ in range(5)] == [False] * 5
    wait_for(lambda: len(fleets(store)) == 1, message="the fleet running")
    (fleet,) = fleets(store)
    wait_for(
        lambda: (FleetLock(lock_path(store.root, KEY)).holder() or {}).get("pid") == fleet.pid,
        message="the fleet naming itself in its lock",
    )
    # No job: it exits after its idle time, and its lock is free again.
    wait_for(
        lambda: not fleet.is_running() or fleet.status() == "zombie",
        timeout=30,
        message="the idle fleet gone",
    )
    assert FleetLock(lock_path(store.root, KEY)).held_elsewhere() is False


def test_a_dead_fleets_lock_is_taken_over_a_live_ones_respected(store):
    lock = FleetLock(lock_path(store.root, KEY))
    assert lock.take()
    lock.say_holder({"pid": os.getpid(), "create_time": psutil.Process().create_time()})
    # Held by a live process (this one): nothing is started.
    assert ensure_fleet(store, "kubernetes", KEY, env()) is False
    assert fleets(store) == []
    # The holder named in the file is dead, and the lock is let go a moment later (a
    # process killed with -9 is a zombie before all of its threads have closed its files).
    lock.say_holder({"pid": 999_999_999, "create_time": 0.0})
    lock.release()
    assert ensure_fleet(store, "kubernetes", KEY, env()) is True
    wait_for(lambda: len(fleets(store)) == 1, message="a new fleet")


def test_a_bad_key_is_refused(store):
    with pytest.raises(ValueError, match="not a fleet key"):
        lock_path(store.root, "../../etc/x")
    assert not (store.root / "fleets").exists()


def test_a_fleet_claims_the_jobs_it_adopts_together_and_only_those_still_as_read(store):
    """`FleetRows.claim`: one transaction for all of a new fleet's jobs; a job whose claim
    changed since the fleet read it (another supervisor took it), or that ended, is not
    taken. `forget_holders`, the reaper's side, is as careful."""
    for n in range(4):
        store.insert_job(_record(f"job-{n}"), b"payload")
    dead = json.dumps({"pid": 999_999_999, "create_time": 0.0})
    for n in range(4):
        store.update_job(f"job-{n}", supervisor=json.loads(dead))
    store.update_job("job-2", supervisor={"pid": os.getpid(), "create_time": 1.0})  # since
    store.update_job("job-3", state=JobState.CANCELLED)
    read = {f"job-{n}": dead for n in range(4)}  # what the fleet read before
    events = store.feed.last_seq()
    me = json.dumps({"pid": os.getpid(), "fleet": KEY})
    assert store.fleet.claim(read, me) == {"job-0", "job-1"}
    assert [store.get_job(f"job-{n}").supervisor for n in range(2)] == [json.loads(me)] * 2
    assert store.get_job("job-2").supervisor["create_time"] == 1.0
    assert store.get_job("job-3").supervisor == json.loads(dead)
    assert store.feed.last_seq() == events + 2  # a change each: a fleet's watch sees them
    # A reaper forgets a dead fleet's claims together, only those still as it read them.
    assert store.fleet.forget_holders({"job-0": me, "job-1": dead, "job-2": me}) == {"job-0"}
    assert store.get_job("job-0").supervisor is None
    assert store.get_job("job-1").supervisor == json.loads(me)


def _record(job_id: str) -> JobRecord:
    return JobRecord(
        id=job_id,
        name=job_id,
        spec=JobSpec.from_options({"workers": 1, "backend": "kubernetes"}),
        state=JobState.QUEUED,
        created=time.time(),
        owner="alice",
        origin={"kind": "python"},
    )


def test_a_fleet_brings_its_jobs_up_a_few_at_a_time_the_running_ones_first(store):
    """A new fleet starts ADOPTING_AT_ONCE of the jobs it takes at a time (a job is up when
    its loop first waits), the jobs whose ranks run first: a thousand adopted at once shared
    the GIL a thousand ways, and the running ones were followed again last."""
    total, running = ADOPTING_AT_ONCE + 8, 3
    for n in range(total):
        store.insert_job(_record(f"job-{n:03d}"), b"payload", {"launch.json": LAUNCH})
    for n in range(total - running, total):  # the newest run
        store.transition(f"job-{n:03d}", JobState.RUNNING, started=time.time())
    started: list[str] = []
    members: dict[str, FleetMember] = {}
    done = threading.Event()

    class Probe(SupervisorFleet):
        """Each job's supervision only says it started and waits to be let go."""

        def _supervise(self, job_id: str, member: FleetMember) -> None:
            members[job_id] = member
            started.append(job_id)
            done.wait(60)

    fleet = Probe(store, "kubernetes", KEY)
    fleet.turns.turn_limit = 600.0  # (none is slow here: turns end only by coming up)
    fleet.turns.run_starter()
    try:
        assert fleet.adopt() == total
        wait_for(lambda: len(started) == ADOPTING_AT_ONCE, message="the first turns")
        assert set(started[:running]) == {f"job-{n:03d}" for n in range(total - running, total)}
        for n in range(5):  # one comes up (its loop waits): the next starts
            members[started[n]].wait_length(False)
            wait_for(lambda n=n: len(started) == ADOPTING_AT_ONCE + n + 1, message="a turn")
        assert len(started) == ADOPTING_AT_ONCE + 5 < total
        assert all(store.get_job(j).supervisor["fleet"] == KEY for j in fleet.members)
    finally:
        done.set()
