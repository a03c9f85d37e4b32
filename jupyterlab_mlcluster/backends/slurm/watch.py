"""Slurm asked once: one watcher per user and host asks about all of that user's jobs.

Every process following a Slurm job (a job's supervisor) runs one `Watch` thread. The
threads of all such processes of one user on one host compete for an exclusive lock
(flock) on `<store>/slurm-watch/<user>@<host>.lock`; the one holding it is the watcher.
At most once per `slurm_poll_interval`, whatever the number of jobs, it asks `squeue` once
about all of the user's jobs (while one of the followed jobs waits: about every user's, in
Slurm's priority order, so that the same answer gives each waiting job its place in its
partition's queue), asks `sacct` about followed jobs that have left squeue, and writes the
answer as one JSON snapshot beside the lock: a temporary file renamed over the old one, so
that no reader ever sees half of one. Every follower reads the snapshot when it changes.

The lock is the kernel's: a watcher that dies (a kill -9 included) lets go of it, and the
next follower to try (every READ_EVERY) takes over. Followers say which Slurm jobs they
follow with one file each in `<user>@<host>.want/` (its content: their pid), so that the
watcher asks sacct about the ones squeue no longer shows; a file whose process is gone is
removed. An answer counts for a job only if it was asked after the job was submitted
(`since`): a job absent from an older answer is not taken for one Slurm forgot.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import re
import threading
import time
from pathlib import Path
from typing import Any

from ...jobs.backoff import Backoff
from ...runtime.atomic import write_whole
from .commands import SlurmCommands, SlurmError

log = logging.getLogger("jupyterlab_mlcluster.supervisor")

READ_EVERY = 0.2  # seconds between a follower's looks at the snapshot (a stat when unchanged)
# squeue failing this many asks in a row (each already retried) loses the jobs: each is
# cancelled as far as Slurm lets us and failed, saying why.
MAX_LOOK_FAILURES = 5
LOOK_BACKOFF = Backoff(first=1.0, cap=15.0, floor=0.5)
_SAFE = re.compile(r"[^A-Za-z0-9_.-]")


class LostSlurm(Exception):
    """squeue failed MAX_LOOK_FAILURES times in a row (each call already retried)."""


def watch_dir(store_root: Path) -> Path:
    return Path(store_root) / "slurm-watch"


def snapshot_path(store_root: Path, user: str) -> Path:
    host = os.uname().nodename
    return watch_dir(store_root) / f"{_SAFE.sub('_', user)}@{_SAFE.sub('_', host)}.json"


def read_snapshot(path: Path) -> dict[str, Any] | None:
    """The watcher's last answer (None: none yet, or unreadable)."""
    try:
        with open(path, "rb") as f:
            value = json.load(f)
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def job_view(
    snapshot: dict[str, Any] | None, slurm_id: str, partition: str, since: float
) -> tuple[dict[str, str] | None, int | None]:
    """One job as a snapshot says it: (row, place in its partition's pending queue). Row
    None: no answer asked after `since` yet; {}: Slurm forgot the job (neither squeue nor
    sacct knows it)."""
    if not snapshot or float(snapshot.get("asked_at") or 0) < since:
        return None, None
    row = (snapshot.get("jobs") or {}).get(slurm_id) or (snapshot.get("accounted") or {}).get(
        slurm_id
    )
    if not row:
        return {}, None
    position = None
    pending = snapshot.get("pending")
    if row.get("state") == "PENDING" and pending is not None:
        place = 0
        for job_id, partitions in pending:
            if not partition or partition in str(partitions).split(","):
                place += 1
                if job_id == slurm_id:
                    position = place
                    break
    return row, position


class Watch(threading.Thread):
    """This process's follower of the user's snapshot, and the watcher when it holds the
    lock. One per process and store (`watch_for`)."""

    def __init__(self, store_root: Path, commands: SlurmCommands, interval: float, user: str):
        super().__init__(daemon=True, name="slurm-watch")
        self.commands = commands
        self.interval = interval
        self.user = user
        self.path = snapshot_path(store_root, user)
        self.lock_path = self.path.with_suffix(".lock")
        # One per host too: a store on a shared filesystem may serve several login nodes,
        # and a follower's pid means something on its own host only.
        self.want_dir = self.path.with_suffix(".want")
        self._guard = threading.Lock()
        self._wake = threading.Event()
        self._followed: dict[str, tuple[str, float]] = {}  # slurm id -> (partition, since)
        self._snapshot: dict[str, Any] | None = None
        self._seen: tuple[int, int] | None = None  # (inode, mtime_ns) of the snapshot read
        self._lock_fd: int | None = None  # kept open: each try is one flock call
        self._holding = False
        self._next_ask = 0.0
        self._sacct = True  # False once sacct said accounting is off here
        self.want_dir.mkdir(parents=True, exist_ok=True, mode=0o700)

    # -- followers --------------------------------------------------------------------------

    def follow(self, slurm_id: str, partition: str, since: float) -> None:
        want = self.want_dir / _SAFE.sub("_", slurm_id)
        want.write_text(str(os.getpid()))
        with self._guard:
            self._followed[slurm_id] = (partition, since)
        self._wake.set()

    def unfollow(self, slurm_id: str) -> None:
        with self._guard:
            self._followed.pop(slurm_id, None)
        with contextlib.suppress(OSError):
            (self.want_dir / _SAFE.sub("_", slurm_id)).unlink()

    def latest(self, slurm_id: str) -> tuple[dict[str, str] | None, int | None]:
        with self._guard:
            snapshot = self._snapshot
            partition, since = self._followed.get(slurm_id, ("", float("inf")))
        if snapshot and int(snapshot.get("failures") or 0) >= MAX_LOOK_FAILURES:
            if float(snapshot.get("failed_at") or 0) >= since:
                raise LostSlurm(str(snapshot.get("error")))
        return job_view(snapshot, slurm_id, partition, since)

    def refresh(self) -> None:
        self._wake.set()

    @property
    def following(self) -> bool:
        with self._guard:
            return bool(self._followed)

    # -- the thread -------------------------------------------------------------------------

    def run(self) -> None:
        """For the process's life (a daemon thread); while it follows nothing it lets go of
        the lock, so that a process whose jobs ended never stays the watcher."""
        while True:
            if not self.following:
                self._let_go()
                self._wake.wait(READ_EVERY * 5)
            elif self._hold() and time.time() >= self._next_ask:
                try:
                    self._ask()
                except OSError as exc:  # the store (a full disk): the next turn tries again
                    log.warning("cannot write the Slurm snapshot %s: %s", self.path, exc)
                    self._next_ask = time.time() + self.interval
            if self.following:
                self._read()
                self._wake.wait(READ_EVERY)
            self._wake.clear()

    def _hold(self) -> bool:
        """Whether this process is the watcher (taking the lock if nobody holds it)."""
        if self._holding:
            return True
        if self._lock_fd is None:
            self._lock_fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return False
        self._holding = True
        previous = read_snapshot(self.path) or {}
        # The watcher before may have asked a moment ago, or be backing off: its successor
        # keeps to the same pace.
        self._next_ask = float(previous.get("next_ask") or 0)
        return True

    def _let_go(self) -> None:
        if self._holding and self._lock_fd is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
        self._holding = False

    def _read(self) -> None:
        try:
            st = os.stat(self.path)
        except OSError:
            return
        seen = (st.st_ino, st.st_mtime_ns)
        if seen == self._seen:
            return
        snapshot = read_snapshot(self.path)
        if snapshot is not None:
            with self._guard:
                self._snapshot, self._seen = snapshot, seen

    # -- the watcher ------------------------------------------------------------------------

    def _wanted(self) -> list[str]:
        """Slurm ids some live process follows (files of gone processes are removed)."""
        wanted = []
        for entry in self.want_dir.iterdir():
            try:
                if not entry.name.isdigit():  # (a Slurm job id of ours is a number)
                    raise ValueError(entry.name)
                pid = int(entry.read_text().strip() or 0)
                if pid > 0:  # (0: its follower is writing it)
                    os.kill(pid, 0)
            except (ValueError, ProcessLookupError):
                with contextlib.suppress(OSError):
                    entry.unlink()
                continue
            except FileNotFoundError:  # (its follower let go of it meanwhile)
                continue
            except OSError:
                pass  # (alive, another uid: not ours to judge)
            wanted.append(entry.name)
        return wanted

    def _ask(self) -> None:
        previous = read_snapshot(self.path) or {}
        asked_at = time.time()
        try:
            wanted = self._wanted()
            known = {**(previous.get("accounted") or {}), **(previous.get("jobs") or {})}
            # (a job not seen yet was just submitted: it waits, most likely)
            waiting = any((known.get(i) or {}).get("state", "PENDING") == "PENDING" for i in wanted)
            rows = self.commands.queue(user=None if waiting else self.user, by_priority=waiting)
            jobs = {r["id"]: r for r in rows if r["user"] == self.user}
            pending = [[r["id"], r["partition"]] for r in rows if r["state"] == "PENDING"]
            left = [i for i in wanted if i not in jobs]
            accounted = self._accounting(left) if left else {}
        except SlurmError as exc:
            failures = int(previous.get("failures") or 0) + 1
            log.warning("squeue failed (%d in a row): %s", failures, exc)
            previous.update(
                failures=failures,
                failed_at=time.time(),
                error=str(exc),
                next_ask=time.time() + LOOK_BACKOFF.delay(failures - 1),
                watcher=os.getpid(),
            )
            self._next_ask = previous["next_ask"]
            self._write(previous)
            return
        self._next_ask = asked_at + self.interval
        self._write(
            {
                "asked_at": asked_at,
                "answered_at": time.time(),
                "watcher": os.getpid(),
                "jobs": jobs,
                "pending": pending if waiting else None,
                "accounted": accounted,
                "failures": 0,
                "next_ask": self._next_ask,
            }
        )

    def _accounting(self, job_ids: list[str]) -> dict[str, dict[str, str]]:
        """sacct's rows of jobs squeue no longer shows; none where accounting is off."""
        if not self._sacct:
            return {}
        try:
            return {r["id"]: r for r in self.commands.accounting(job_ids)}
        except SlurmError as exc:
            if "accounting storage is disabled" in str(exc).lower():
                self._sacct = False
            else:
                log.warning("sacct: %s", exc)
            return {}

    def _write(self, snapshot: dict[str, Any]) -> None:
        write_whole(self.path, json.dumps(snapshot))


_watches: dict[tuple[int, str], Watch] = {}
_watches_lock = threading.Lock()


def watch_for(store_root: Path, commands: SlurmCommands, interval: float, user: str) -> Watch:
    """This process's Watch of the store (started, or restarted once it had stopped)."""
    key = (os.getpid(), str(store_root))  # (a forked child starts its own)
    with _watches_lock:
        watch = _watches.get(key)
        if watch is None:
            watch = _watches[key] = Watch(store_root, commands, interval, user)
            watch.start()
        return watch


class Following:
    """One attempt's view of its Slurm job through the process's Watch."""

    def __init__(self, watch: Watch, slurm_id: str, partition: str, since: float):
        self.watch, self.slurm_id = watch, slurm_id
        watch.follow(slurm_id, partition, since)

    def latest(self) -> tuple[dict[str, str] | None, int | None]:
        return self.watch.latest(self.slurm_id)

    def refresh(self) -> None:
        self.watch.refresh()

    def stop(self) -> None:
        self.watch.unfollow(self.slurm_id)
