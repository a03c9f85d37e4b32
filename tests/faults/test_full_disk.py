"""A full disk under the job store, for real: the store on a 3 MiB tmpfs that the test fills
with a ballast file, real supervisors and ranks (cold interpreters), the real CLI and a real
`jupyter server`. Figures printed: faults injected, jobs that came through, lost (must be 0).

- A submission is all or nothing: a row and a complete job directory, or neither.
- Listings (JobStore, JobService, `mlcluster jobs`, GET /jobs) answer while the disk is full,
  also when no process has the database open (a WAL reader must create its -shm index).
- A running job whose supervisor cannot write ends `failed`, its reason "no space left on
  <device> ... (writing <path>)", as soon as space allows; nothing of it keeps running.
- Once space is back, new jobs run again.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import random
import subprocess
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from helpers import assert_no_job_processes, run_cli, scenario_seed, wait_for

from jupyterlab_mlcluster.jobs.model import JobSpec, JobState
from jupyterlab_mlcluster.jobs.service import JobService
from jupyterlab_mlcluster.jobs.store import STAGING_PREFIX, JobStore
from jupyterlab_mlcluster.runtime.payload import Payload

DISK_SIZE = "3m"
CHATTY_RANK = """\
import sys, time
i = 0
while True:
    print(f"line {i} " + "x" * 200, flush=True)
    i += 1
    time.sleep(0.002)
"""


class Disk:
    """A small tmpfs and a ballast file that fills it."""

    def __init__(self, path: Path):
        self.path = path
        self.ballast = path / "ballast"

    def fill(self, leave: int = 0) -> None:
        """Fill the filesystem, then free `leave` bytes again."""
        with open(self.ballast, "ab", buffering=0) as f:
            for chunk in (1 << 16, 1 << 12, 512, 1):
                try:
                    while True:
                        f.write(b"\0" * chunk)
                except OSError as exc:
                    assert exc.errno == errno.ENOSPC, exc
        if leave:
            size = self.ballast.stat().st_size
            os.truncate(self.ballast, max(0, size - leave))

    def free(self) -> None:
        self.ballast.unlink(missing_ok=True)

    def full(self) -> bool:
        st = os.statvfs(self.path)
        return st.f_bavail * st.f_frsize < 4096


@pytest.fixture
def disk(store_dir, tmp_path, monkeypatch):
    """A 3 MiB tmpfs of this test's own (tmp_path is unique per test and xdist worker); the
    job store on it (after store_dir, so `service` opens this one)."""
    mount_point = tmp_path / f"disk-{uuid.uuid4().hex[:8]}"
    mount_point.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={DISK_SIZE},mode=0700", "tmpfs", str(mount_point)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        pytest.skip(f"a tmpfs cannot be mounted here (needs root): {done.stderr.strip()}")
    try:
        monkeypatch.setenv("MLCLUSTER_STORE_DIR", str(mount_point / "store"))
        monkeypatch.setenv("JUPYTER_CONFIG_DIR", str(tmp_path / "jupyter-config"))
        monkeypatch.setenv("MLCLUSTER_WARM_POOL", "0")
        yield Disk(mount_point)
    finally:
        Disk(mount_point).free()
        if subprocess.run(["umount", str(mount_point)], capture_output=True).returncode:
            subprocess.run(["umount", "-l", str(mount_point)], capture_output=True)


@dataclass
class Figures:
    injected: int = 0  # operations run against a full (or nearly full) disk
    refused: int = 0  # submissions refused with nothing left behind
    accepted: int = 0  # submissions taken whole
    listings: int = 0  # listings answered on a full disk
    jobs: int = 0
    survived: int = 0  # jobs accounted for: final, with a true state and reason
    lost: int = 0  # half-written submissions, crashed listings, jobs stuck or lost
    notes: list[str] = field(default_factory=list)

    def line(self) -> str:
        return (
            f"full disk: faults injected {self.injected}, submissions refused whole "
            f"{self.refused}, accepted whole {self.accepted}, listings answered {self.listings}, "
            f"jobs {self.jobs}, survived {self.survived}, lost: {self.lost}"
        )


def _check_whole(store: JobStore, figures: Figures) -> set[str]:
    """Every job directory has its row and every row its directory with a payload; no
    staging directory is left. Returns the ids of the rows."""
    rows = set(store.job_owners())
    dirs = {p.name for p in (store.root / "jobs").iterdir()}
    staging = {d for d in dirs if d.startswith(STAGING_PREFIX)}
    for name in staging | (dirs - staging - rows) | (rows - dirs):
        figures.lost += 1
        figures.notes.append(f"half-written: {name}")
    for job_id in rows & dirs:
        payload = store.payload_path(job_id)
        if not payload.exists() or payload.stat().st_size == 0:
            figures.lost += 1
            figures.notes.append(f"{job_id}: empty payload")
    return rows


def _listings(service: JobService, expected: set[str], figures: Figures) -> None:
    """Every way of listing jobs, on the full disk: each must answer, with every job."""
    figures.injected += 3
    fresh = JobStore(service.store.root)  # a process opening the store now
    listed = {r.id for r in fresh.list_jobs()[0]}
    fresh.close()
    assert expected <= listed, (expected, listed)
    assert expected <= {r.id for r in service.list()[0]}
    cli = run_cli("jobs", "--json")
    assert cli.returncode == 0, cli.stderr
    assert "Traceback" not in cli.stderr, cli.stderr
    assert expected <= {j["id"] for j in json.loads(cli.stdout)}
    figures.listings += 3


def _payload(rng: random.Random) -> Payload:
    # Incompressible filler of random size: the write that hits the full disk falls at a
    # different point each time (payload, its copy as cell.py, launch.json, the commit).
    blob = os.urandom(rng.randint(1, 160_000)).hex()
    return Payload(source=f"_ = {blob!r}\nprint('ok')\n")


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
            accepted.append(service.submit(JobSpec.from_options({"workers": 1}), _payload(rng)).id)
            figures.accepted += 1
        except Exception as exc:  # noqa: BLE001 - which error a full disk raises varies
            text = str(exc).lower()
            assert "no space" in text or "disk is full" in text or "disk i/o" in text, repr(exc)
            figures.refused += 1
        rows = _check_whole(service.store, figures)
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
    all along, and once there is space it is `failed`, saying what is full. Then a new job
    runs."""
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
    disk.fill()
    figures.injected += 1
    assert disk.full()
    # The supervisors stop the ranks at once; their final word waits for space, or goes
    # into the WAL's already allocated pages.
    for job_id in victims:
        wait_for(
            lambda job_id=job_id: not any(
                r.pid for r in service.store.get_job(job_id).ranks if _alive(r.pid)
            ),
            message="the ranks stopped",
        )
    _listings(service, set(victims), figures)
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
    service.store.close()
    disk.fill()
    figures.injected += 1
    _listings(service, set(victims), figures)
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
        with contextlib.suppress(Exception):
            first.stop()
        if second is not None:
            second.stop()
        disk.free()


def _alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with contextlib.suppress(OSError, ValueError):
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    return False


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
