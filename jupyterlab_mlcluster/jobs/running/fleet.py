"""One supervising process for many jobs: a fleet.

A backend whose supervisors mostly wait on someone else's controller (Kubernetes) would spend
a process per job, 56 MiB each, and a poll of the store per job ten times a second. Its jobs
are supervised together instead: one fleet process per store and cluster (`key`) runs each
job's supervisor (supervisor.supervise) as a thread, and does once for all of them what each
did for itself:

- it watches the store's change feed (one watcher) and wakes a job's loop when its row
  changes (a cancel request), instead of each job polling;
- it beats for all of its jobs in one statement (every FLEET_BEAT_INTERVAL);
- it adopts: on start, every unfinished job of the backend whose supervisor is dead; later,
  each job submitted (its CREATED change) or handed back by a reaper.

Its claims name the fleet's process, so the reaper judges a fleet's jobs as it judges any
supervisor's: when the fleet dies, each job's supervisor is dead, and the reaper's respawn
starts a new fleet (`ensure_fleet`), which adopts them all; the backend resumes each
(Kubernetes: adopts the objects, skips the log lines already stored).

The fleet of a key is elected by an exclusive lock (flock) on `<store>/fleets/<key>.lock`:
the kernel's, so a fleet killed with -9 lets go of it at once. A fleet with no job left for
IDLE_EXIT seconds exits; it lets go of the lock first and looks once more, and a submitter
looks at the lock only after its job is stored, so no job falls between a leaving fleet and
a new one.

Run as `python -m jupyterlab_mlcluster.jobs.running.fleet STORE_DIR BACKEND KEY [JOURNAL]`.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import functools
import json
import logging
import os
import resource
import signal
import sqlite3
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..storage.database import Database
from ..storage.store import JobStore
from ..storage.watch import StoreWatcher
from .lifelines import StoreWatch
from .processes import holder_alive, process_is, start_detached
from .turns import StartInTurns

log = logging.getLogger("jupyterlab_mlcluster.fleet")

# A fleet with no job for this long exits (the next submit starts one); the environment may
# say otherwise (MLCLUSTER_FLEET_IDLE_EXIT, seconds).
IDLE_EXIT = 30.0
BACKSTOP_LOOK = 5.0  # a job looks at its row this often even when nothing woke it
MEMBER_IDLE_WAIT = 1.0  # how long a member's loop waits for news when nothing happens
# ... and while its job waits for the cluster (nothing to sample, time or poll): news comes
# as events (its objects' changes, its row's), so this is only a backstop.
MEMBER_QUIET_WAIT = 30.0
# The fleet's beat: its claims are judged by its process on this host; the heartbeat only
# counts for a reader on another host, after HEARTBEAT_STALE (a minute).
FLEET_BEAT_INTERVAL = 10.0
FEED_WAIT = 0.5  # the fleet's own loop: at most this long between looks at the store
EXITING_HOLDER_WAIT = 10.0  # a starter waits this long for a dead fleet's lock to be let go
# The store connections a fleet keeps for its jobs' threads to borrow (database.py's lending):
# a thread holds one only while its job has something to do.
SPARE_CONNECTIONS = 8


def fleets_dir(store_root: Path) -> Path:
    return store_root / "fleets"


def lock_path(store_root: Path, key: str) -> Path:
    if not key.replace("-", "").isalnum():
        raise ValueError(f"not a fleet key: {key!r}")
    return fleets_dir(store_root) / f"{key}.lock"


class FleetLock:
    """The exclusive lock that makes one process the fleet of its key."""

    def __init__(self, path: Path, fd: int | None = None):
        """`fd`: the lock already taken, by the process that started this one (the
        descriptor was inherited, and with it the flock)."""
        self.path = path
        self._fd = fd
        if fd is not None:  # (inherited: no process this one starts may hold the lock on)
            os.set_inheritable(fd, False)

    def take(self) -> bool:
        """Whether this process now holds it (False: another live fleet does)."""
        if self._fd is not None:
            return True
        self.path.parent.mkdir(mode=0o700, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        self._fd = fd
        return True

    def say_holder(self, identity: dict[str, Any]) -> None:
        """Write who holds the lock into its file (a starter tells a live holder from one
        still exiting: a process killed with -9 is a zombie before all of its threads have
        let go of its descriptors)."""
        assert self._fd is not None
        data = json.dumps(identity).encode()
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, data, 0)

    def holder(self) -> dict[str, Any] | None:
        try:
            return json.loads(self.path.read_bytes() or b"null")
        except (OSError, ValueError):
            return None

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # (closing the only descriptor lets go of the flock)
            self._fd = None

    @property
    def fd(self) -> int | None:
        return self._fd

    def held_elsewhere(self) -> bool:
        """Whether a live fleet holds it now (taken and let go again to find out)."""
        if not self.take():
            return True
        self.release()
        return False


class FleetMember:
    """What a job's supervisor gets from its fleet instead of a process of its own: the
    fleet's identity for its claim, a wake-up when its row changes (`look`), which reaches
    the backend's loop through `wake` (set by its current attempt), and how long that loop
    may wait for news."""

    idle_wait = MEMBER_IDLE_WAIT
    quiet_wait = MEMBER_QUIET_WAIT

    def __init__(
        self,
        identity: dict[str, Any],
        claimed: bool = False,
        up: Callable[[FleetMember], None] | None = None,
    ):
        """`claimed`: the fleet claimed the job for it already (else its supervisor does).
        `up(member)`: called once, when the job's loop first waits (or its supervision
        ends)."""
        self.identity = identity
        self.claimed = claimed
        self._up = up
        self.wake: Callable[[], None] | None = None
        self._look = threading.Event()
        self._look.set()  # look once at the start

    def look(self) -> None:
        """The job's row changed (or the store went): its loop should look, now."""
        self._look.set()
        wake = self.wake
        if wake is not None:
            wake()

    def wait_length(self, active: bool) -> float:
        """How long the job's loop may wait for news now (`active`: its ranks run, or it polls
        something); its thread lends its store connections to the others meanwhile."""
        self.came_up()
        Database.lend_this_threads()
        return self.idle_wait if active else self.quiet_wait

    def came_up(self) -> None:
        """The job is up (its loop waits for news) or its supervision ended: its turn at
        coming up goes to the next job (SupervisorFleet's adopting turns)."""
        up, self._up = self._up, None
        if up is not None:
            up(self)

    def due(self, since_last: float) -> bool:
        """Whether the job's cancel check should read the store now."""
        if self._look.is_set():
            self._look.clear()
            return True
        return since_last >= BACKSTOP_LOOK


class SupervisorFleet:
    """The fleet of one store, backend and key (see the module docstring)."""

    def __init__(self, store: JobStore, backend: str, key: str, lock_fd: int | None = None):
        self.store = store
        self.backend = backend
        self.key = key
        self.lock = FleetLock(lock_path(store.root, key), lock_fd)
        from .supervisor import identity

        self.identity = {**identity(), "fleet": key}
        self.claim_text = json.dumps(self.identity)
        self.members: dict[str, tuple[FleetMember, threading.Thread]] = {}
        self.turns = StartInTurns()  # the jobs of its first look come up in turns (turns.py)
        self.stopping = threading.Event()
        self._idle_since = time.monotonic()
        self._last_beat = 0.0
        self.idle_exit = float(os.environ.get("MLCLUSTER_FLEET_IDLE_EXIT") or IDLE_EXIT)

    # -- adopting -------------------------------------------------------------------------

    def _mine(self, job_id: str) -> bool:
        from .supervisor import launch_settings

        return launch_settings(self.store.root, job_id).get("fleet") == self.key

    def adopt(self, among: set[str] | None = None) -> int:
        """Start supervising the backend's unfinished jobs (`among` those ids) of this key
        whose supervisor is not alive; how many were taken."""
        orphans: dict[str, str | None] = {}  # id -> its claim as read
        rows = self.store.fleet.unfinished(self.backend, among)
        # The jobs whose ranks run come up first: they have output to follow.
        rows.sort(key=lambda row: row["state"] not in ("running", "starting"))
        for row in rows:
            job_id = row["id"]
            if job_id in self.members or not self._mine(job_id):
                continue
            holder = json.loads(row["supervisor"]) if row["supervisor"] else None
            if holder is not None and holder_alive(holder, row["heartbeat"]):
                continue
            orphans[job_id] = row["supervisor"]
        if not orphans:
            return 0
        try:  # claimed together: one write, not each job's thread queueing for the lock
            claimed = self.store.fleet.claim(orphans, self.claim_text)
        except (sqlite3.Error, OSError) as exc:  # (a full disk: each supervisor waits for it)
            log.warning(
                "claiming %d jobs together failed (%s): each claims its own", len(orphans), exc
            )
            claimed = None
        for job_id in orphans:
            if claimed is None or job_id in claimed:
                # A fleet's first look (or a resync) may take a thousand at once: in turns.
                # A job submitted, or handed back, comes up at once.
                self._start(job_id, claimed is not None, in_turn=among is None)
        return len(orphans) if claimed is None else len(claimed)

    def _start(self, job_id: str, claimed: bool, in_turn: bool) -> None:
        """The job's thread, started now or in its turn (`turns`)."""
        member = FleetMember(self.identity, claimed, self.turns.up if in_turn else None)
        thread = threading.Thread(
            target=self._supervise, args=(job_id, member), name=f"job-{job_id}", daemon=True
        )
        self.members[job_id] = (member, thread)
        if in_turn:
            self.turns.put(thread, member)
        else:
            thread.start()

    def _supervise(self, job_id: str, member: FleetMember) -> None:
        from .lifelines import StoreGone
        from .supervisor import supervise

        try:
            supervise(self.store, job_id, None, member)
        except StoreGone as exc:
            log.warning("the supervision of %s stops: %s", job_id, exc)
        except Exception:
            log.exception("the supervision of %s failed", job_id)
        finally:
            member.came_up()

    # -- the loop -------------------------------------------------------------------------

    def run(self) -> int:
        if not self.lock.take():
            log.info("another fleet holds %s", self.lock.path)
            return 0
        self.lock.say_holder(self.identity)
        _more_descriptors()
        store_watch = StoreWatch(self.store, None)
        watcher = StoreWatcher(self.store)
        self.turns.run_starter()
        try:
            self.adopt()
            while not self.stopping.is_set():
                watcher.wait(FEED_WAIT)
                changes = watcher.poll()
                gone = store_watch.gone()
                if gone:
                    log.warning("the store is gone (%s): the fleet's jobs stop", gone)
                    self._wake_all()
                    self._join_members(None)
                    return 1
                if changes.resync:
                    self._wake_all()
                    self.adopt()
                for job_id in changes.jobs | changes.deleted:
                    held = self.members.get(job_id)
                    if held is not None:
                        held[0].look()
                new = changes.jobs - self.members.keys()
                if new:
                    self.adopt(new)
                self._tend()
                if self._leave_when_idle():
                    return 0
        finally:
            watcher.close()
            store_watch.close()
            self.lock.release()
        return 0

    def _wake_all(self) -> None:
        for member, _ in list(self.members.values()):
            member.look()

    def _tend(self) -> None:
        """Forget ended members; one heartbeat for all the others."""
        for job_id, (_, thread) in list(self.members.items()):
            if thread.ident is not None and not thread.is_alive():  # (started, and ended)
                del self.members[job_id]
        if self.members:
            self._idle_since = time.monotonic()
        now = time.monotonic()
        if now - self._last_beat >= FLEET_BEAT_INTERVAL:
            self._last_beat = now
            with contextlib.suppress(Exception):  # (a full disk: the claim is the process)
                self.store.fleet.beat(self.claim_text)
            _give_back_free_memory()

    def _leave_when_idle(self) -> bool:
        """No job for IDLE_EXIT: let go of the lock, then look once more (a job stored
        before a submitter found the lock free would be seen here)."""
        if self.members or time.monotonic() - self._idle_since < self.idle_exit:
            return False
        self.lock.release()
        if self.adopt() and self.lock.take():
            self.lock.say_holder(self.identity)
            return False
        for job_id in list(self.members):  # (taken, but a new fleet holds the lock now)
            self.members[job_id][0].look()
        self._join_members(None)
        return True

    def _join_members(self, timeout: float | None) -> None:
        for _, thread in list(self.members.values()):
            if thread.ident is not None:  # (one still waiting for its turn never starts)
                thread.join(timeout)

    def stop(self, *_: Any) -> None:
        """SIGTERM: the fleet goes; its jobs live on (the next fleet adopts them)."""
        self.stopping.set()


@functools.cache
def _libc() -> Any:
    return ctypes.CDLL("libc.so.6")


def _give_back_free_memory() -> None:
    """Hand the allocator's free pages back to the system (glibc keeps what a burst of
    adoptions freed); a few milliseconds every FLEET_BEAT_INTERVAL."""
    with contextlib.suppress(OSError, AttributeError):
        _libc().malloc_trim(0)


def _more_descriptors() -> None:
    """A job holds a few descriptors (its log files, its store paths): a thousand jobs
    need more than the usual soft limit of 1,024."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


LOCK_FD_VARIABLE = "MLCLUSTER_FLEET_LOCK_FD"


def ensure_fleet(store: JobStore, backend: str, key: str, env: dict[str, str]) -> bool:
    """Start the fleet of `key` unless a live one holds its lock; whether one was started.
    Called after the job is stored (see the module docstring). The lock is taken here and
    handed to the new process: a burst of submits while it starts starts no second one."""
    lock = FleetLock(lock_path(store.root, key))
    deadline = time.monotonic() + EXITING_HOLDER_WAIT
    while not lock.take():
        holder = lock.holder() or {}
        if process_is(holder.get("pid"), holder.get("create_time")):
            return False  # a live fleet: it sees the stored job itself
        if time.monotonic() > deadline:
            log.warning("the fleet lock %s is held by no live fleet", lock.path)
            return False
        time.sleep(0.05)  # a fleet still exiting lets go of the lock in a moment
    fd = lock.fd
    assert fd is not None
    try:
        start_detached(
            [
                sys.executable,
                "-m",
                "jupyterlab_mlcluster.jobs.running.fleet",
                str(store.root),
                backend,
                key,
                store.journal_mode,
            ],
            open(fleets_dir(store.root) / f"{key}.out", "ab"),
            # glibc gives each thread that allocates an arena of its own (up to 8 a core):
            # two keep what a burst of adoptions frees in few places, for malloc_trim.
            env={"MALLOC_ARENA_MAX": "2", **env, LOCK_FD_VARIABLE: str(fd)},
            reaper_name=f"mlcluster-fleet-{key}",
            pass_fds=(fd,),
        )
    finally:
        lock.release()  # (the child's copy of the descriptor holds the lock on)
    return True


def _log_to_bounded_file(path: Path) -> None:
    """Log records (the fleet's and every job's supervisor's) go to the fleet's log,
    rotated at 1 MiB (one old copy kept): an outage must not fill the disk."""
    from logging.handlers import RotatingFileHandler

    handler = RotatingFileHandler(path, maxBytes=1 << 20, backupCount=1)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    debug = bool(os.environ.get("MLCLUSTER_DEBUG"))
    logging.basicConfig(level=logging.DEBUG if debug else logging.WARNING, handlers=[handler])


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) not in (3, 4):
        print(
            "usage: python -m jupyterlab_mlcluster.jobs.running.fleet STORE_DIR BACKEND KEY"
            " [JOURNAL_MODE]",
            file=sys.stderr,
        )
        return 2
    Database.lent_connections_kept = SPARE_CONNECTIONS
    Database.writers_take_turns = True  # (SIGINT is the fleet's own: see database.py)
    store = JobStore(Path(argv[0]), journal_mode=argv[3] if len(argv) == 4 else "auto")
    _log_to_bounded_file(lock_path(store.root, argv[2]).with_suffix(".log"))
    inherited = os.environ.pop(LOCK_FD_VARIABLE, None)
    fleet = SupervisorFleet(store, argv[1], argv[2], int(inherited) if inherited else None)
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, fleet.stop)
    code = fleet.run()
    # The jobs' threads are daemons: leaving now lets the next fleet adopt what they held.
    logging.shutdown()
    os._exit(code)


if __name__ == "__main__":
    # The kubernetes client's first import (kubernetes.dynamic) imports kubernetes_validate
    # where it is installed, and jsonschema's format checkers with it, which build dozens of
    # lark grammars: seconds of a new fleet's first adoption, holding every job's thread at
    # the import lock. Nothing here validates manifests.
    sys.modules.setdefault("kubernetes_validate", None)  # type: ignore[arg-type]
    from ... import backends  # noqa: F401  (the backend registry, as a cold supervisor's)

    sys.exit(main())
