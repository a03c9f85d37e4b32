"""A job store removed or stuck under a running supervisor, for real: real supervisors (cold
interpreters) and ranks of the local backend. Figures printed: faults injected, processes
that ended, processes left (must be 0).

- The store's directory deleted while a job runs (a test's temporary store removed under
  it): its supervisor notices within a second or two, stops its ranks and exits. Its open
  database and log files still work after the deletion, so nothing fails by itself; without
  the check the supervisor followed its ranks for as long as they ran (hours).
- A store deleted and made again at the same path is another store: the same.
- SIGTERM ends a supervisor that is waiting for space to write its job's final state on a
  full disk (it used to wait for as long as the disk stayed full, SIGTERM or not), and the
  job is still settled once there is space (by the reaper).
"""

from __future__ import annotations

import os
import shutil
import signal

import pytest
from helpers import wait_for

from jupyterlab_mlcluster.jobs.model import JobSpec, JobState
from jupyterlab_mlcluster.jobs.running.lifelines import StoreWatch
from jupyterlab_mlcluster.jobs.service import JobService
from jupyterlab_mlcluster.jobs.storage.store import RESERVE_NAME, JobStore
from jupyterlab_mlcluster.runtime.payload import Payload
from tests.faults.fulldisk import Disk, alive, mounted

SLEEPER = "import time\nprint('up', flush=True)\ntime.sleep(3600)\n"


def start_sleeper(service: JobService) -> tuple[str, list[int]]:
    """A 2-rank job whose ranks sleep for an hour: (its id, [supervisor pid, rank pids])."""
    job = service.submit(JobSpec.from_options({"workers": 2}), Payload(source=SLEEPER))

    def started():
        record = service.store.get_job(job.id)
        pids = [r.pid for r in record.ranks]
        up = [lines for lines in service.store.read_logs(job.id) if lines]
        return (
            record.supervisor and all(pids) and len(up) == 2 and [record.supervisor["pid"], *pids]
        )

    return job.id, wait_for(started, timeout=60, message="the ranks up")


def ended(pids: list[int]) -> bool:
    return not any(alive(pid) for pid in pids)


def kill_left(pids: list[int]) -> None:
    for pid in pids:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


@pytest.fixture
def cold(store_dir, monkeypatch):
    monkeypatch.setenv("MLCLUSTER_WARM_POOL", "0")  # a supervisor of its own interpreter
    return store_dir


@pytest.mark.parametrize("how", ["removed", "replaced"])
def test_supervisor_and_ranks_end_when_the_store_goes(cold, how):
    service = JobService()
    job_id, pids = start_sleeper(service)
    service.store.close()
    # `rm -rf` of the whole store, again until it is gone: a supervisor may still add a
    # file (its job's end marker) while the tree is being removed.
    wait_for(lambda: not shutil.rmtree(cold, ignore_errors=True) and not cold.exists())
    if how == "replaced":
        JobStore(cold).close()  # a new, empty store where the job's was
    try:
        wait_for(lambda: ended(pids), timeout=30, message="the supervisor and its ranks gone")
    finally:
        left = [pid for pid in pids if alive(pid)]
        kill_left(pids)
    print(f"\nstore {how}: faults injected 1, processes ended {len(pids) - len(left)}, left: 0")


def test_store_watch_tells_removed_from_replaced(tmp_path):
    store = JobStore(tmp_path / "store")
    (store.root / "jobs" / "j1").mkdir(parents=True)
    watch, untouched = StoreWatch(store, "j1"), StoreWatch(store, "j1")
    assert watch.gone() is None
    store.close()
    shutil.rmtree(store.root)
    assert watch.gone() == f"the job store was removed ({store.root})"
    again = JobStore(store.root)
    (again.root / "jobs" / "j1").mkdir(parents=True)
    assert untouched.gone() == f"the job store was replaced by another ({store.root})"
    assert watch.gone() == f"the job store was removed ({store.root})"  # it stays gone
    again.close()
    watch.close()
    untouched.close()


@pytest.fixture
def full_disk_store(tmp_path, monkeypatch):
    """The store on a 3 MiB tmpfs of this test's own, in rollback-journal mode: with a full
    disk every write fails (a WAL may still have pages to spare)."""
    with mounted(tmp_path, "3m") as mount_point:
        if isinstance(mount_point, str):
            pytest.skip(mount_point)
        monkeypatch.setenv("MLCLUSTER_STORE_DIR", str(mount_point / "store"))
        monkeypatch.setenv("JUPYTER_CONFIG_DIR", str(tmp_path / "jupyter-config"))
        monkeypatch.setenv("MLCLUSTER_WARM_POOL", "0")
        monkeypatch.setenv("MLCLUSTER_STORE_JOURNAL_MODE", "delete")
        yield Disk(mount_point)


def test_sigterm_ends_a_supervisor_waiting_for_space(full_disk_store):
    disk = full_disk_store
    service = JobService()
    job_id, pids = start_sleeper(service)
    supervisor, ranks = pids[0], pids[1:]
    try:
        # The store's reserve spent already (it would make room for one write), then no space.
        (service.store.root / RESERVE_NAME).unlink()
        disk.fill()
        assert disk.full()
        # Its next heartbeat fails: the ranks are stopped, and the job's failure waits for
        # space (retried with backoff) for as long as the disk stays full.
        wait_for(lambda: ended(ranks), timeout=60, message="the ranks stopped")
        assert alive(supervisor), "the supervisor must still be waiting for space"
        os.kill(supervisor, signal.SIGTERM)
        wait_for(lambda: ended([supervisor]), timeout=20, message="the supervisor gone")
        assert disk.full()  # it left without writing: the disk is still full
    finally:
        kill_left(pids)
        disk.free()
    # The reaper settles the job whose supervisor left: nothing stays `running`.
    record = service.wait(job_id, timeout=60)
    assert record.state == JobState.FAILED, (record.state, record.error)
    print("\nfull disk + SIGTERM: faults injected 2, supervisor ended 1, job settled 1, left: 0")
    service.store.close()
