"""kill -9 at random (seeded) moments of the supervisor, the warm pool's zygote, the Jupyter
server, the kernel and the notebook-controller, with real processes; a few rounds each (the
long randomised version: bench/bench_kill9.py). Every figure must be zero: orphaned
processes (rank grandchildren included, also those in a session of their own), jobs stuck
non-final, lost log lines of finished ranks, duplicate Kubernetes objects."""

from __future__ import annotations

import json
import os
import random

import pytest
from helpers import scenario_seed

from jupyterlab_mlcluster.config import MLClusterConfig
from jupyterlab_mlcluster.jobs.service import JobService
from tests.faults import kill9


def _check(tally: kill9.Tally, seed: int) -> None:
    print(f"\n{kill9.HEADER}\n{tally.row()}  (seed {seed})")
    assert tally.injected >= 1, tally
    assert tally.bad == 0, (seed, tally.notes)
    assert tally.survived == tally.rounds


@pytest.fixture
def piddir(tmp_path):
    path = tmp_path / "pids"
    path.mkdir()
    return path


@pytest.mark.parametrize("mode", ["cgroup-cold", "groups-cold", "groups-warm"])
def test_kill9_supervisor(service, piddir, monkeypatch, mode):
    """With a cgroup where one is writable, and without (process groups, the supervisor as
    subreaper, the reaper's scan); cold ranks and warm ones forked from a zygote's fork."""
    containment, pool = mode.split("-")
    monkeypatch.setenv("MLCLUSTER_WARM_POOL", "1" if pool == "warm" else "0")
    monkeypatch.setenv("MLCLUSTER_RANK_CGROUP", "1" if containment == "cgroup" else "0")
    seed = scenario_seed()
    jobs = JobService(MLClusterConfig(warm_pool_modules=["json"]))
    tally = kill9.supervisor_rounds(jobs, random.Random(seed), 3, piddir)
    _check(tally, seed)
    # Which cleanup a job got is said once in its supervisor.log (none if it died before
    # its ranks were to start).
    # (A job killed before its ranks were to start may say none: which jobs do depends on the
    # machine's speed, so each job whose ranks did start must say it, once.)
    said = {
        r.id: (jobs.store.job_dir(r.id) / "supervisor.log").read_text().count("rank cleanup:")
        for r in jobs.store.list_jobs()[0]
    }
    started = {r.id for r in jobs.store.list_jobs()[0] if jobs.store.rank_processes(r.id)}
    assert set(said.values()) <= {0, 1}, said
    assert all(said[job_id] == 1 for job_id in started), (said, started)
    expected = "cgroup v2" if containment == "cgroup" else "process groups + child subreaper"
    logs = [
        (jobs.store.job_dir(r.id) / "supervisor.log").read_text() for r in jobs.store.list_jobs()[0]
    ]
    assert all(expected in text for text in logs if "rank cleanup:" in text), logs


@pytest.mark.parametrize("mode", ["cgroup-cold", "groups-warm"])
def test_kill9_of_a_supervisor_nobody_watches(service, piddir, monkeypatch, mode):
    """kill -9 of a running job's supervisor while no other mlcluster process runs (this
    test only reads the store and /proc): what its ranks started (a child in the rank's
    group, one in a session of its own) is gone within 2 s, and the job is settled, by the
    supervisor's sentinel. bench/bench_kill9.py --targets supervisor-alone: 50 rounds."""
    containment, pool = mode.split("-")
    monkeypatch.setenv("MLCLUSTER_WARM_POOL", "1" if pool == "warm" else "0")
    monkeypatch.setenv("MLCLUSTER_RANK_CGROUP", "1" if containment == "cgroup" else "0")
    jobs = JobService(MLClusterConfig(warm_pool_modules=["json"]))
    tally, slowest = kill9.lonely_supervisor_rounds(jobs, 3, piddir)
    print(f"\n{kill9.HEADER}\n{tally.row()}  (slowest: {slowest:.2f} s to zero)")
    assert tally.injected == tally.rounds == 3
    assert tally.bad == 0, tally.notes
    assert tally.survived == tally.rounds
    for record in jobs.store.list_jobs()[0]:
        assert record.state.value == "failed" and "supervisor" in (record.error or ""), record


def test_what_ranks_started_ends_with_the_job(service, piddir, monkeypatch):
    """No fault: a job that succeeds and one that is cancelled leave nothing of their ranks
    (grandchildren in the rank's group and in a session of their own), and every line of
    the succeeded ranks is in the log."""
    monkeypatch.setenv("MLCLUSTER_WARM_POOL", "0")
    tally = kill9.Tally("no fault")
    done = kill9.submit(service, piddir, 5)
    cancelled = service.submit(
        kill9.JobSpec.from_options({"workers": 2}),
        kill9.Payload(source=kill9.rank_code(piddir, 10**6, pause=0.05)),
    ).id
    from helpers import wait_for

    wait_for(lambda: len(list(piddir.glob(f"{cancelled}-*"))) == 2, message="ranks up")
    service.cancel(cancelled)
    assert kill9.settle(service, tally, {done: 5, cancelled: 0}, piddir), tally.notes
    assert service.store.get_job(done).state.value == "succeeded"
    assert service.store.get_job(cancelled).state.value == "cancelled"


def test_kill9_zygote(store_dir, service, piddir, monkeypatch):
    monkeypatch.setenv("MLCLUSTER_WARM_POOL", "1")
    seed = scenario_seed()
    # A zygote that preloads nothing heavy: restarting it is part of every round.
    warm = JobService(MLClusterConfig(warm_pool_modules=["json"]))
    tally = kill9.zygote_rounds(warm, random.Random(seed), 2, piddir)
    _check(tally, seed)


def test_kill9_kernel(service, piddir, monkeypatch):
    monkeypatch.setenv("MLCLUSTER_WARM_POOL", "0")
    seed = scenario_seed()
    tally = kill9.kernel_rounds(service, random.Random(seed), 2, piddir, dict(os.environ))
    _check(tally, seed)


def test_kill9_server(service, piddir, tmp_path, store_dir):
    from tests.server.live import LiveServer

    seed = scenario_seed()
    tally = kill9.server_rounds(
        service,
        random.Random(seed),
        1,
        piddir,
        lambda: LiveServer(tmp_path / "home", store_dir).start(),
    )
    _check(tally, seed)


def test_kill9_controller(kube, kube_namespace, tmp_path):
    from tests.kube.controller_support import install_crds

    install_crds(kube)
    seed = scenario_seed()
    tally = kill9.controller_rounds(
        kube, kube_namespace, random.Random(seed), 2, tmp_path / "controller.log"
    )
    _check(tally, seed)


def test_the_reaper_kills_only_what_is_the_jobs(tmp_path):
    """Playing the attacker against the reaper's records: a containment.json naming another
    job's cgroup, a path that climbs out, and a rank record whose pid now belongs to another
    process (pid reuse) make it kill nothing; the job's own cgroup it empties and removes."""
    import subprocess
    import uuid

    import psutil

    from jupyterlab_mlcluster.jobs.running import proctree

    victim = f"victim-{uuid.uuid4().hex[:8]}"  # other test sessions may run this at once
    other = proctree.job_cgroup_path(f"bystander-{uuid.uuid4().hex[:8]}")
    if other is None or not proctree._make_job_cgroup(other):
        pytest.skip("no writable cgroup v2 here (the reaper then uses groups and the scan)")
    bystander = subprocess.Popen(["sleep", "60"])
    mine = None
    try:
        (other / "cgroup.procs").write_text(str(bystander.pid))
        job_dir = tmp_path / "job"
        job_dir.mkdir()
        host = proctree.this_host()
        started = psutil.Process(bystander.pid).create_time()
        forged = [
            str(other),  # another job's cgroup
            str(other.parent / f"mlcluster-{victim}" / ".." / other.name),  # climbs out
            str(other.parent),  # the parent of every job's cgroup
        ]
        for path in forged:
            (job_dir / proctree.RECORD_NAME).write_text(json.dumps({"host": host, "cgroup": path}))
            # pid reuse: the recorded rank's pid is now the bystander, started at another time
            proctree.kill_orphaned_tree(job_dir, victim, [(0, bystander.pid, started - 100)])
            assert bystander.poll() is None, path
        # The job's own cgroup: emptied and removed.
        mine = proctree.job_cgroup_path(victim)
        assert proctree._make_job_cgroup(mine)
        inside = subprocess.Popen(["sleep", "60"])
        (mine / "cgroup.procs").write_text(str(inside.pid))
        (job_dir / proctree.RECORD_NAME).write_text(json.dumps({"host": host, "cgroup": str(mine)}))
        proctree.kill_orphaned_tree(job_dir, victim, [])
        assert inside.wait(10) == -9 and not mine.exists()
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()
        for cgroup in (other, mine):
            if cgroup is not None and cgroup.exists():
                cgroup.rmdir()
