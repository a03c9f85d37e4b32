"""Shared by tests/faults/test_full_disk.py and bench/bench_full_disk.py: a small tmpfs
filled with a ballast file, the store invariants after a full disk, and the figures."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import random
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from helpers import run_cli

from jupyterlab_mlcluster.jobs.service import JobService
from jupyterlab_mlcluster.jobs.storage.store import STAGING_PREFIX, JobStore
from jupyterlab_mlcluster.runtime.payload import Payload

CHATTY_RANK = """\
import sys, time
i = 0
while True:
    print(f"line {i} " + "x" * 200, flush=True)
    i += 1
    time.sleep(0.002)
"""


@contextlib.contextmanager
def mounted(parent: Path, size: str) -> Iterator[Path | str]:
    """A tmpfs of `size` at a fresh directory under `parent` (unique: two test workers never
    share one); yields its path, or the reason it could not be mounted (not root)."""
    mount_point = parent / f"disk-{uuid.uuid4().hex[:8]}"
    mount_point.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(mount_point)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        yield f"a tmpfs cannot be mounted here (needs root): {done.stderr.strip()}"
        return
    try:
        yield mount_point
    finally:
        Disk(mount_point).free()
        if subprocess.run(["umount", str(mount_point)], capture_output=True).returncode:
            subprocess.run(["umount", "-l", str(mount_point)], capture_output=True)


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


@dataclass
class Figures:
    injected: int = 0  # operations run against a full (or nearly full) disk
    refused: int = 0  # submissions refused with nothing left behind
    accepted: int = 0  # submissions taken whole
    listings: int = 0  # listings answered on a full disk
    jobs: int = 0
    survived: int = 0  # jobs accounted for: final, with a true state and reason
    lost: int = 0  # half-written submissions, crashed listings, jobs stuck or lost
    orphans: int = 0  # processes of a job left once it ended (the bench counts them)
    said_full: int = 0  # jobs that survived as `failed`, saying "no space left on ..."
    notes: list[str] = field(default_factory=list)

    def line(self) -> str:
        return (
            f"full disk: faults injected {self.injected}, submissions refused whole "
            f"{self.refused}, accepted whole {self.accepted}, listings answered {self.listings}, "
            f"jobs {self.jobs}, survived {self.survived}, lost: {self.lost}"
        )


def check_whole(store: JobStore, figures: Figures) -> set[str]:
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


def alive(pid: int | None) -> bool:
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


def listings(service: JobService, expected: set[str], figures: Figures) -> None:
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


def random_payload(rng: random.Random) -> Payload:
    # Incompressible filler of random size: the write that hits the full disk falls at a
    # different point each time (payload, its copy as cell.py, launch.json, the commit).
    blob = os.urandom(rng.randint(1, 160_000)).hex()
    return Payload(source=f"_ = {blob!r}\nprint('ok')\n")
