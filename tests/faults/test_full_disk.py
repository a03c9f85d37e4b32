"""A full disk under the job store, for real: the store on a 3 MiB tmpfs that the test fills
with a ballast file, real supervisors and ranks (cold interpreters), the real CLI and a real
`jupyter server`. Figures printed: faults injected, jobs that came through, lost (must be 0).

- A submission is all or nothing: a row and a complete job directory, or neither.
- Listings (JobStore, JobService, `mlcluster jobs`, GET /jobs) answer while the disk is full,
  also when no process has the database open (a WAL reader must create its -shm index).
- A running job whose supervisor cannot write ends `failed`, its reason "no space left on
  <device> ... (writing <path>)", as soon as space allows; nothing of it keeps running.
- Once space is back, new jobs run again.
- The attached `mlcluster run` returns within 10 s of the disk filling ("no space left on
  <device> mounted at <dir> ...; the job's ranks were stopped"), the listing says failed
  while the disk is still full (the store's reserve is spent on it), and a Ctrl-C on a full
  disk cancels without a raw traceback.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import assert_no_job_processes, scenario_seed, wait_for

from jupyterlab_mlcluster.jobs.model import JobSpec, JobState
from jupyterlab_mlcluster.jobs.service import JobService
from jupyterlab_mlcluster.jobs.storage.store import RESERVE_BYTES, RESERVE_NAME, JobStore
from jupyterlab_mlcluster.runtime.atomic import temporary_name
from jupyterlab_mlcluster.runtime.payload import Payload
from tests.faults.fulldisk import (
    CHATTY_RANK,
    Disk,
    Figures,
    alive,
    check_whole,
    listings,
    mounted,
    random_payload,
)

DISK_SIZE = "3m"


@pytest.fixture
def disk(store_dir, tmp_path, monkeypatch):
    """A 3 MiB tmpfs of this test's own (tmp_path is unique per test and xdist worker); the
    job store on it (after store_dir, so `service` opens this one)."""
    with mounted(tmp_path, DISK_SIZE) as mount_point:
        if isinstance(mount_point, str):
            pytest.skip(mount_point)
        monkeypatch.setenv("MLCLUSTER_STORE_DIR", str(mount_point / "store"))
        monkeypatch.setenv("JUPYTER_CONFIG_DIR", str(tmp_path / "jupyter-config"))
        monkeypatch.setenv("MLCLUSTER_WARM_POOL", "0")
        yield Disk(mount_point)


def test_submission_is_all_or_nothing(disk, service):
    """Submissions into a disk with 0..600 KiB left: each is refused leaving nothing, or
    stored whole (and then runs: succeeded, or failed for the full disk)."""
    seed = scenario_seed()
    rng = random.Random(seed)
    figures = Figures()
    accepted = []
    for _ in range(12):
        disk.fill(leave=rng.choice([0, rng.randint(0, 600_000)]))
        figures.injected += 1
        try:
            accepted.append(
                service.submit(JobSpec.from_options({"workers": 1}), random_payload(rng)).id
            )
            figures.accepted += 1
        except Exception as exc:  # noqa: BLE001 - which error a full disk raises varies
            text = str(exc).lower()
            assert "no space" in text or "disk is full" in text or "disk i/o" in text, repr(exc)
            figures.refused += 1
        rows = check_whole(service.store, figures)
        assert rows == set(accepted), (rows, accepted)
        disk.free()
    assert figures.refused >= 1, "no submission met a full disk"
    # Every accepted job finishes: it ran, or it failed saying the disk was full.
    for job_id in accepted:
        record = service.wait(job_id, timeout=60)
        figures.jobs += 1
        ok = record.state == JobState.SUCCEEDED or (
            record.state == JobState.FAILED and "no space left on" in (record.reason or "")
        )
        if ok:
            figures.survived += 1
        else:
            figures.lost += 1
            figures.notes.append(f"{job_id}: {record.state} {record.error}")
    print(f"\n{figures.line()}  (seed {seed})")
    assert figures.lost == 0, figures.notes


def test_running_job_fails_saying_the_disk_is_full(disk, service):
    """A job writing logs when the disk fills: its ranks are stopped, the listings answer
    all along, and once there is space it is `failed`, saying what is full, and what a rank
    killed mid-write left (a temporary file of write_whole's) is gone. Then a new job runs."""
    figures = Figures()
    victims = [
        service.submit(JobSpec.from_options({"workers": 2}), Payload(source=CHATTY_RANK)).id
        for _ in range(2)
    ]
    for job_id in victims:
        wait_for(
            lambda job_id=job_id: service.store.read_logs(job_id, tail=1)[0],
            message="the ranks writing",
        )
    leftovers = []
    for job_id in victims:
        result = service.store.result_path(job_id)
        leftover = Path(temporary_name(str(result)).replace(f".{os.getpid()}.", ".4194304."))
        leftover.write_bytes(b"half a result")
        leftovers.append(leftover)
    disk.fill()
    figures.injected += 1
    assert disk.full()
    # The supervisors stop the ranks at once; their final word waits for space, or goes
    # into the WAL's already allocated pages.
    for job_id in victims:
        wait_for(
            lambda job_id=job_id: (
                not any(r.pid for r in service.store.get_job(job_id).ranks if alive(r.pid))
            ),
            message="the ranks stopped",
        )
    listings(service, set(victims), figures)
    # A listing on a full disk with no process holding the database.
    disk.free()
    for job_id in victims:
        record = service.wait(job_id, timeout=60)
        figures.jobs += 1
        reason = record.reason or ""
        if (
            record.state == JobState.FAILED
            and reason.startswith("no space left on tmpfs")
            and str(disk.path) in reason
            and record.error == reason
        ):
            figures.survived += 1
        else:
            figures.lost += 1
            figures.notes.append(f"{job_id}: {record.state} reason={record.reason!r}")
    assert_no_job_processes(service)
    assert not [p for p in leftovers if p.exists()]
    service.store.close()
    disk.fill()
    figures.injected += 1
    listings(service, set(victims), figures)
    disk.free()
    # Space is back: a new job runs, and says so in its log.
    again = service.submit(JobSpec.from_options({"workers": 2}), Payload(source="print('back')"))
    record = service.wait(again.id, timeout=60)
    figures.jobs += 1
    if record.state == JobState.SUCCEEDED:
        figures.survived += 1
    else:
        figures.lost += 1
        figures.notes.append(f"after space came back: {record.state} {record.error}")
    lines = [line["line"] for line in service.logs(again.id)[0]]
    assert lines.count("back") == 2, lines
    print(f"\n{figures.line()}")
    assert figures.lost == 0, figures.notes


def test_rest_listing_on_a_full_disk(disk, tmp_path):
    """GET /jobs of a real server answers while the disk is full (its own connection is
    open; a second server starting then opens the store read-only)."""
    from tests.server.live import LiveServer

    store = Path(os.environ["MLCLUSTER_STORE_DIR"])
    service = JobService()
    job = service.submit(JobSpec.from_options({"workers": 1}), Payload(source="print(1)"))
    assert service.wait(job.id, timeout=60).state == JobState.SUCCEEDED
    service.store.close()
    first = LiveServer(tmp_path / "home1", store).start()
    second = None
    try:
        assert first.request("GET", "jobs")[0] == 200
        disk.fill()
        status, body = first.request("GET", "jobs")
        assert status == 200 and [j["id"] for j in body["jobs"]] == [job.id], body
        first.stop()
        second = LiveServer(tmp_path / "home2", store).start()
        status, body = second.request("GET", "jobs")
        assert status == 200 and [j["id"] for j in body["jobs"]] == [job.id], body
        print("\nfull disk: GET /jobs answered 2 of 2 (faults injected 2, lost: 0)")
    finally:
        first.stop()
        if second is not None:
            second.stop()
        disk.free()


def test_a_job_that_fills_the_disk_itself(disk, service):
    """Rank 0's result is larger than the disk: the job fails saying so, at once (no
    half-written result file is left to keep the disk full), and the next job runs."""
    big = service.submit(
        JobSpec.from_options({"workers": 1}), Payload(source="import os\nos.urandom(4_000_000)")
    )
    record = service.wait(big.id, timeout=60)
    assert record.state == JobState.FAILED, (record.state, record.error)
    assert record.error.startswith("rank 0 failed: ResultError: no space left on"), record.error
    assert str(service.store.result_path(big.id)) in record.error
    assert not list(service.store.job_dir(big.id).glob("*.tmp*"))
    assert not disk.full()
    small = service.submit(JobSpec.from_options({"workers": 1}), Payload(source="1 + 1"))
    assert service.wait(small.id, timeout=60).state == JobState.SUCCEEDED
    assert service.result(small.id) == ("value", 2)
    print("\nfull disk: a job filling the disk itself failed saying so; the next ran (lost: 0)")


FILL_THEN_FAIL = """\
import os
print("filling", flush=True)
ballast = os.path.join(os.path.dirname(os.environ["MLCLUSTER_ERROR_FILE"]), "ballast")
with open(ballast, "wb", buffering=0) as f:
    for chunk in (1 << 16, 1 << 12, 512, 1):
        try:
            while True:
                f.write(b"x" * chunk)
        except OSError:
            pass
raise ValueError("boom")
"""


def test_a_rank_whose_error_report_meets_a_full_disk(disk, service):
    """The rank's error file cannot be written (its log still has room in its last page):
    the report comes over the report channel, and the job says why the rank failed."""
    job = service.submit(JobSpec.from_options({"workers": 1}), Payload(source=FILL_THEN_FAIL))
    ballast = service.store.job_dir(job.id) / "ballast"
    wait_for(lambda: ballast.exists(), message="the rank filling the disk")
    wait_for(
        lambda: not any(alive(pid) for _r, pid, _s in service.store.rank_processes(job.id)),
        message="the rank gone",
    )
    ballast.unlink()  # the supervisor's final word may be waiting for space
    record = service.wait(job.id, timeout=60)
    assert record.state == JobState.FAILED
    assert record.error == "rank 0 failed: ValueError: boom" or (record.reason or "").startswith(
        "no space left on"
    ), (record.error, record.reason)
    assert not list(service.store.job_dir(job.id).glob("error-*"))
    print(f"\nfull disk: a rank's error report without a file: {record.error!r} (lost: 0)")


UNWRITABLE_ERROR_FILE = """\
import os
from jupyterlab_mlcluster.runtime.atomic import temporary_name
os.mkdir(temporary_name(os.environ["MLCLUSTER_ERROR_FILE"]))
raise ValueError("boom")
"""


def test_an_error_report_that_cannot_be_written_still_arrives(service):
    """Deterministically, what a full disk does at random: the rank's error file cannot be
    written (here its temporary name is a directory), the report comes over the rank's
    signed report channel and the job names the rank's exception, not just its exit status."""
    job = service.submit(
        JobSpec.from_options({"workers": 2}), Payload(source=UNWRITABLE_ERROR_FILE)
    )
    record = service.wait(job.id, timeout=60)
    assert record.state == JobState.FAILED
    # (then, where the other rank was, if it was still alive to be read: jobs/forensics/)
    assert record.error.startswith(
        ("rank 0 failed: ValueError: boom", "rank 1 failed: ValueError: boom")
    ), record.error
    lines = [line["line"] for line in service.logs(job.id)[0]]
    assert any(line.startswith("mlcluster: cannot write") for line in lines), lines


def test_a_dead_submitters_staging_directory_is_swept(service):
    """A submitter killed between writing a job's files and inserting its row leaves a
    staging directory (never a job directory without a row): the reaper removes it once it
    is old enough that no live submission can own it."""
    import time

    from jupyterlab_mlcluster.jobs.storage.store import STAGING_PREFIX, STAGING_STALE

    jobs_dir = service.store.root / "jobs"
    old = jobs_dir / f"{STAGING_PREFIX}j0123456789"
    fresh = jobs_dir / f"{STAGING_PREFIX}jabcdefabcd"
    for path in (old, fresh):
        (path / "logs").mkdir(parents=True)
        (path / "payload.pkl").write_bytes(b"x")
    then = time.time() - STAGING_STALE - 5
    os.utime(old, (then, then))
    service.reap(force=True)
    assert not old.exists() and fresh.exists()
    assert service.list()[1] == 0


def reaps_on_a_full_disk(service, disk, caplog, job_id: str):
    """Fill the disk, then reap three times with a fresh JobService (its store read-only):
    each reap settles nothing and listings still show the job. (the reaper, what was said
    about the job)"""
    import logging

    service.store.close()
    disk.fill()
    caplog.set_level(logging.WARNING, logger="jupyterlab_mlcluster.service")
    reaper = JobService()
    assert reaper.store.database.read_only
    for _ in range(3):
        assert reaper.reap(force=True) == []
        assert [r.id for r in reaper.list()[0]] == [job_id]
    return reaper, [r.getMessage() for r in caplog.records if job_id in r.getMessage()]


def test_a_dead_supervisors_job_is_settled_once_there_is_space(disk, service, caplog):
    """kill -9 of a supervisor and of its sentinel (the OOM killer may take both: no one
    settles the job at once), then the disk fills with nobody holding the store open: the
    reapers (a fresh JobService: read-only) cannot write the job's end; they say so once,
    listings answer, and the first reap after space is back settles it."""
    import psutil

    job = service.submit(JobSpec.from_options({"workers": 2}), Payload(source=CHATTY_RANK))
    wait_for(lambda: service.store.read_logs(job.id, tail=1)[0], message="the ranks writing")
    sup = service.store.get_job(job.id).supervisor
    supervisor = psutil.Process(sup["pid"])
    # The sentinel is the supervisor's fork (its command line); the ranks exec their own.
    # Left alive, it would settle the job at once, or hold the store open (its -shm file
    # with it) while the disk fills, and the reaper below would not be read-only.
    sentinels = [c for c in supervisor.children() if c.cmdline() == supervisor.cmdline()]
    assert len(sentinels) == 1, sentinels
    for victim in (sentinels[0].pid, sup["pid"]):
        os.kill(victim, signal.SIGKILL)
        wait_for(lambda victim=victim: not alive(victim), message=f"{victim} gone")
    reaper, said = reaps_on_a_full_disk(service, disk, caplog, job.id)
    assert len(said) == 1 and "cannot settle" in said[0], said
    disk.free()
    assert reaper.reap(force=True) == [job.id]
    record = reaper.store.get_job(job.id)
    assert record.state == JobState.FAILED and "died unexpectedly" in record.reason
    said = [r.getMessage() for r in caplog.records if job.id in r.getMessage()]
    assert said[-1] == f"job {job.id} settled after 3 tries (a full disk)", said
    reaper.store.close()
    print("\nfull disk: a dead supervisor's job settled after 3 refused reaps (lost: 0)")


def test_a_final_jobs_pending_cleanup_waits_for_space_and_is_said_once(disk, service, caplog):
    """A final Kubernetes job whose objects are still to delete (a pending cleanup, which its
    backend records again before each attempt): with the disk full (the reaper's store
    read-only) no reap can record it; they say so once, listings answer, and the first reap
    after space is back records it (its next attempt still an hour ahead: no cluster asked)."""
    import time

    from jupyterlab_mlcluster.jobs.record import JobRecord
    from jupyterlab_mlcluster.jobs.service import new_job_id

    job_id, now = new_job_id(), time.time()
    pending = {"since": now - 60, "attempts": 4, "next_attempt": now + 3600}
    service.store.insert_job(
        JobRecord(
            id=job_id,
            name="cleanup",
            spec=JobSpec(backend="kubernetes"),
            state=JobState.SUCCEEDED,
            created=now - 120,
            finished=now - 60,
            backend_state={"pending_cleanup": pending},
        ),
        b"payload",
    )
    reaper, said = reaps_on_a_full_disk(service, disk, caplog, job_id)
    assert len(said) == 1 and said[0].startswith(f"cannot clean up job {job_id} yet"), said
    disk.free()
    reaper.reap(force=True)
    state = reaper.store.get_job(job_id).backend_state
    assert state["pending_cleanup"]["attempts"] == 4  # kept; not due yet, so not tried
    assert len([r for r in caplog.records if job_id in r.getMessage()]) == 1
    reaper.store.close()
    print("\nfull disk: a pending cleanup refused by 3 reaps, said once, kept (lost: 0)")


def test_a_supervisor_stops_waiting_for_space_once_its_store_is_gone(tmp_path):
    """A supervisor waiting for space to write its job's end, whose store is then removed
    (its directory deleted, its disk unmounted): nobody could ever read that word, so it
    stops instead of waiting forever, a process no one can reach."""
    import errno
    import shutil

    from jupyterlab_mlcluster.jobs.running import supervisor
    from jupyterlab_mlcluster.jobs.running.lifelines import StoreGone, StoreWatch

    store = JobStore(tmp_path / "store")
    watch = StoreWatch(store, "j1")
    tries = []

    def write():
        tries.append(1)
        if len(tries) == 2:
            shutil.rmtree(store.root)
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(StoreGone, match="the job store was removed"):
        supervisor._until_written(store, write, "the job's end", watch.gone)
    assert len(tries) == 2
    watch.close()


def attached_run(script: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "jupyterlab_mlcluster.cli", "run", "--workers", "2", str(script)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_an_attached_run_returns_when_the_disk_fills(disk, service, tmp_path):
    """`mlcluster run` following a chatty job returns within 10 s of the disk filling, saying
    what is full and that the ranks were stopped; the listing says failed, with the same
    reason, while the disk is still full (the store's reserve made room for it)."""
    script = tmp_path / "chatty.py"
    script.write_text(CHATTY_RANK)
    assert (disk.path / "store" / RESERVE_NAME).stat().st_size == RESERVE_BYTES
    proc = attached_run(script)
    try:
        wait_for(lambda: service.store.list_jobs()[0], message="the job stored")
        (job,) = service.store.list_jobs()[0]
        wait_for(lambda: service.store.read_logs(job.id, tail=1)[0], message="ranks writing")
        disk.fill()
        filled = time.monotonic()
        _out, err = proc.communicate(timeout=10)
        returned = time.monotonic() - filled
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    print(f"\nmlcluster run returned {returned:.2f} s after the disk filled")
    assert proc.returncode == 1 and returned < 10
    assert disk.ballast.exists()  # the disk was not freed meanwhile (only the reserve was)
    record = service.get(job.id)
    assert record.state == JobState.FAILED
    assert record.reason.startswith("no space left on tmpfs (tmpfs) mounted at ")
    assert str(disk.path) in record.reason
    assert record.reason.endswith("; the job's ranks were stopped")
    assert f"job {job.id} failed: {record.reason}" in err
    assert "Traceback" not in err
    assert not (disk.path / "store" / RESERVE_NAME).exists()  # spent on the job's end
    assert_no_job_processes(service)
    # With space back, the next store opened keeps a reserve again.
    disk.free()
    JobStore(disk.path / "store").close()
    assert (disk.path / "store" / RESERVE_NAME).exists()


def test_ctrl_c_on_a_full_disk_cancels_without_a_traceback(disk, service, tmp_path):
    """The disk fills while the job's ranks are quiet; Ctrl-C of the attached run then
    cannot write the cancel request: the supervisor is asked by signal, the run returns
    saying the job was cancelled, and no raw sqlite3 traceback is printed."""
    script = tmp_path / "quiet.py"
    script.write_text("import time\nprint('ready', flush=True)\ntime.sleep(300)\n")
    proc = attached_run(script)
    try:
        ready = 0
        while ready < 2:
            line = proc.stdout.readline()
            assert line, proc.stderr.read()
            ready += line.strip().endswith("ready")
        disk.fill()
        interrupted = time.monotonic()
        proc.send_signal(signal.SIGINT)
        _out, err = proc.communicate(timeout=30)
        returned = time.monotonic() - interrupted
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 1 and returned < 10, err
    assert "Traceback" not in err and "OperationalError" not in err, err
    (record,) = service.store.list_jobs()[0]
    assert record.state in (JobState.CANCELLED, JobState.FAILED), record
    assert f"job {record.id} " in err
    assert_no_job_processes(service)
