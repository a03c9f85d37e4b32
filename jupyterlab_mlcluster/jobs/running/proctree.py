"""Whole-tree cleanup of a local job's ranks: nothing a rank started outlives the job.

A rank is its own session and process group, but what it starts may make its own session
(`setsid`, a daemon's double fork) and so leave any group. Layers, strongest first:

- **cgroup v2** where this process's cgroup directory is writable (root, or a delegated
  subtree such as systemd's user@.service): the job gets a child cgroup
  `mlcluster-<job id>`, each rank joins it before any user code runs, and everything the
  rank starts is born in it, whatever session it makes. `cgroup.kill` (or killing each
  member until none is left) ends the whole tree, also from another process after the
  supervisor was kill -9'd.
- **child subreaper** (PR_SET_CHILD_SUBREAPER) on the supervisor: a descendant whose
  parent died is re-parented to the supervisor, not to init, so every live descendant of a
  rank stays in the supervisor's process tree, and the end of an attempt kills that tree.
- **process groups**: each rank's group is killed whether or not its leader still lives.

When the supervisor itself is kill -9'd its ranks die with it (PR_SET_PDEATHSIG), and its
**sentinel** (a fork of its own, in a session of its own, that only waits on a pipe from
it) sees the pipe close without the supervisor's goodbye and at once ends the rest and
settles the job, with no other mlcluster process running. Whoever else notices the dead
supervisor (the reaper, `kill_orphaned_tree`) does the same: the
job's cgroup, else the recorded ranks' groups (only while the leader is the very process
recorded: a pid may be reused) and every process of this user whose environment names the
job (MLCLUSTER_JOB_ID, which children inherit) and that started after the job's ranks.

Which layer a job got is written to `containment.json` in its job directory (for the
reaper) and said once in its supervisor.log.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import logging
import os
import re
import signal
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import psutil

from ...runtime.atomic import write_whole
from .processes import process_is, this_host

log = logging.getLogger("jupyterlab_mlcluster.proctree")
log.setLevel(logging.INFO)  # the one line saying which containment a job got is kept

_PR_SET_CHILD_SUBREAPER = 36
RECORD_NAME = "containment.json"
CGROUP_PREFIX = "mlcluster-"
# Environment variable naming the cgroup.procs file a rank writes its own pid to (before
# the payload runs), so that nothing it starts is born outside the job's cgroup.
CGROUP_ENV = "MLCLUSTER_CGROUP_PROCS"
KILL_DEADLINE = 10.0
# A process is the job's only if it started after the job's first rank (less this slack for
# the clock resolution of process start times).
START_SLACK = 1.0


# -- cgroup v2 --------------------------------------------------------------------------


def _cgroup2_mount() -> Path | None:
    """Where the cgroup v2 hierarchy is mounted (/sys/fs/cgroup, or .../unified when hybrid)."""
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                left, _, right = line.partition(" - ")
                if right.split(" ", 1)[0] == "cgroup2":
                    return Path(left.split(" ")[4])
    except OSError:
        pass
    return None


def _own_cgroup() -> str | None:
    """This process's cgroup v2 path (the `0::` line of /proc/self/cgroup)."""
    try:
        with open("/proc/self/cgroup") as f:
            for line in f:
                if line.startswith("0::"):
                    return line[3:].strip()
    except OSError:
        pass
    return None


def _valid_job_cgroup(path: Path, job_id: str) -> bool:
    """A recorded path is trusted only if it is a cgroup v2 directory named for this job."""
    mount = _cgroup2_mount()
    if mount is None or path.name != CGROUP_PREFIX + job_id or ".." in path.parts:
        return False
    try:
        path.relative_to(mount)
    except ValueError:
        return False
    return (path / "cgroup.procs").is_file()


def job_cgroup_path(job_id: str) -> Path | None:
    """Where this process would make the job's cgroup (a child of its own), if anywhere."""
    if not re.fullmatch(r"[A-Za-z0-9_.-]{1,200}", job_id):
        return None
    mount, own = _cgroup2_mount(), _own_cgroup()
    if mount is None or own is None:
        return None
    return mount / own.lstrip("/") / (CGROUP_PREFIX + job_id)


def _make_job_cgroup(path: Path) -> bool:
    try:
        path.mkdir(mode=0o755, exist_ok=True)
        # Writable is not enough: moving a process in needs rights on the common ancestor
        # too. Try with ourselves: move in, then back out.
        (path / "cgroup.procs").write_text(str(os.getpid()))
        (path.parent / "cgroup.procs").write_text(str(os.getpid()))
    except OSError:
        try:
            path.rmdir()
        except OSError:
            pass
        return False
    return True


def _members(cgroup: Path) -> list[int]:
    try:
        return [int(p) for p in (cgroup / "cgroup.procs").read_text().split()]
    except (OSError, ValueError):
        return []


def _kill_cgroup(cgroup: Path, deadline: float, reap: bool = False) -> bool:
    """Kill every process in `cgroup` and wait until it is empty; then remove it. `reap`:
    collect our exited children meanwhile (only in the supervisor, whose children are all
    the job's; a reaper in a server must not steal its other children's exit statuses)."""
    kill_file = cgroup / "cgroup.kill"
    while True:
        members = _members(cgroup)
        if not members:
            break
        if kill_file.exists():
            try:
                kill_file.write_text("1")
            except OSError:
                _kill_pids(members)
        else:  # before Linux 5.14: kill each member; new ones are caught next turn
            _kill_pids(members)
        if reap:
            _reap_children()
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    try:
        cgroup.rmdir()
    except OSError:
        pass
    return True


# -- processes ----------------------------------------------------------------------------


def _kill_pids(pids: Iterable[int]) -> None:
    for pid in pids:
        if pid == os.getpid():
            continue
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def killpg(pgid: int, signum: int = signal.SIGKILL) -> None:
    """Signal a process group; one that is already gone is fine."""
    try:
        os.killpg(pgid, signum)
    except OSError as exc:
        if exc.errno not in (errno.ESRCH, errno.EPERM):
            raise


def our_group(pgid: int) -> bool:
    """Is `pgid` a process group with a live member among this process's descendants?

    A rank's group outlives its leader while a member lives, and its id (the leader's pid)
    cannot be reused meanwhile; once the group is empty, the id may belong to anyone. So
    after a rank exited, its group is signalled only if this says yes."""
    return pgid in _live_groups()


def _live_groups() -> set[int]:
    """The process groups of this process's live descendants (one scan of /proc)."""
    try:
        descendants = psutil.Process().children(recursive=True)
    except psutil.Error:
        return set()
    groups = set()
    for proc in descendants:
        try:
            if _alive(proc):
                groups.add(os.getpgid(proc.pid))
        except (OSError, psutil.Error):
            continue
    return groups


def _reap_children(keep: Iterable[int] = ()) -> None:
    """Collect exited children (re-parented orphans become ours as subreaper), except `keep`
    (ranks whose exit status someone else collects)."""
    keep = set(keep)
    try:
        children = psutil.Process().children()
    except psutil.Error:
        return
    for child in children:
        if child.pid in keep:
            continue
        try:
            os.waitpid(child.pid, os.WNOHANG)
        except ChildProcessError:
            pass


def become_subreaper() -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


class Containment:
    """The supervisor's side: set up once per job, `end_attempt` after each attempt's ranks
    have exited or been stopped, `close` when the job is over."""

    def __init__(self, job_dir: Path, job_id: str, use_cgroup: bool = True):
        self.job_id = job_id
        self.job_dir = Path(job_dir)
        self.spared: set[int] = set()
        self.subreaper = become_subreaper()
        self.cgroup = job_cgroup_path(job_id) if use_cgroup else None
        if self.cgroup is not None:
            # Recorded before it exists: a supervisor killed right after making it leaves
            # the reaper a record to find it by (and remove it).
            self._record()
            if not _make_job_cgroup(self.cgroup):
                self.cgroup = None
        if self.cgroup is not None:
            self.mode = f"cgroup v2 {self.cgroup}"
        elif self.subreaper:
            self.mode = "process groups + child subreaper (no writable cgroup v2)"
        else:
            self.mode = "process groups only"
        self._record()
        log.info("rank cleanup: %s", self.mode)

    def _record(self) -> None:
        record = {
            "host": this_host(),
            "cgroup": str(self.cgroup) if self.cgroup else None,
            "subreaper": self.subreaper,
        }
        _write_record(self.job_dir / RECORD_NAME, record)

    def rank_env(self) -> dict[str, str]:
        """Variables a rank needs to join the job's cgroup itself."""
        return {CGROUP_ENV: str(self.cgroup / "cgroup.procs")} if self.cgroup else {}

    def adopt(self, pid: int) -> None:
        """Put a just-started rank in the job's cgroup (it also joins itself, before any user
        code; whichever comes first wins, the other is a no-op)."""
        if self.cgroup is None:
            return
        try:
            (self.cgroup / "cgroup.procs").write_text(str(pid))
        except OSError:
            pass  # already gone

    def reap(self, ranks: Iterable[int]) -> None:
        """Collect re-parented orphans that exited while the ranks run (no zombie piles up)."""
        if self.subreaper:
            _reap_children(keep=ranks)

    def spare(self, pid: int) -> None:
        """A child of the supervisor that is not the ranks' (its sentinel): never killed."""
        self.spared.add(pid)

    def end_attempt(self, rank_groups: Iterable[int], keep: Iterable[int] = ()) -> None:
        """Kill everything the attempt's ranks left: their groups (those still ours), the
        job's cgroup, and every descendant of this process (as subreaper, all of them are)
        but the spared. `keep`: rank pids whose exit status their owner still collects."""
        deadline = time.monotonic() + KILL_DEADLINE
        keep = set(keep)
        ours = _live_groups()  # our_group() of each, from one scan of /proc (not one each)
        for pgid in rank_groups:
            if pgid in ours:
                killpg(pgid)
        if self.cgroup is not None:
            _kill_cgroup_keep(self.cgroup, deadline)
        while time.monotonic() < deadline:
            try:
                descendants = psutil.Process().children(recursive=True)
            except psutil.Error:
                break
            live = [p for p in descendants if _alive(p) and p.pid not in self.spared]
            if not live:
                break
            _kill_pids(p.pid for p in live)
            _reap_children(keep)
            time.sleep(0.02)
        _reap_children(keep)

    def close(self) -> None:
        if self.cgroup is not None:
            _kill_cgroup(self.cgroup, time.monotonic() + KILL_DEADLINE, reap=True)


class Sentinel:
    """A fork of the supervisor that outlives it: when the supervisor dies without saying
    goodbye (kill -9, the OOM killer), `after_death(started)` runs in it at once (`started`:
    the time this sentinel was made, before any rank), so what the ranks
    started is killed within moments even when no other mlcluster process is running.

    It holds only the read end of a pipe whose write end only the supervisor holds (not
    inheritable: ranks never get it), in a session of its own (a signal to the supervisor's
    group or terminal does not reach it), and closes every other descriptor it inherited."""

    def __init__(self, after_death: Callable[[float], None]):
        self.started = time.time()  # before any rank: what is the job's started after it
        read_end, write_end = os.pipe()
        self._write_end: int | None = write_end  # None once released
        pid = os.fork()
        if pid == 0:  # the sentinel
            status = 0
            try:
                os.close(write_end)
                os.setsid()
                for signum in (signal.SIGINT, signal.SIGHUP):
                    signal.signal(signum, signal.SIG_IGN)
                os.closerange(3, read_end)
                os.closerange(read_end + 1, 65536)
                said = b""
                while True:
                    try:
                        chunk = os.read(read_end, 64)
                    except InterruptedError:
                        continue
                    if not chunk:
                        break
                    said += chunk
                if GOODBYE not in said:
                    after_death(self.started)
            except BaseException:  # noqa: BLE001 - say it, in the supervisor's log (fd 2)
                import traceback

                traceback.print_exc()
                status = 1
            finally:
                os._exit(status)
        os.close(read_end)
        self.pid = pid

    def release(self) -> None:
        """The supervisor ends normally: the sentinel exits without doing anything."""
        if self._write_end is None:
            return
        with contextlib.suppress(OSError):
            os.write(self._write_end, GOODBYE)
        os.close(self._write_end)
        self._write_end = None
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pid, 0)


GOODBYE = b"goodbye"


def _kill_cgroup_keep(cgroup: Path, deadline: float) -> None:
    """Empty the cgroup but keep it for the job's next attempt."""
    kill_file = cgroup / "cgroup.kill"
    while _members(cgroup) and time.monotonic() < deadline:
        try:
            kill_file.write_text("1")
        except OSError:
            _kill_pids(_members(cgroup))
        time.sleep(0.02)


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _write_record(path: Path, record: dict) -> None:
    try:
        write_whole(path, json.dumps(record))
    except OSError as exc:
        log.warning("could not record the job's containment in %s: %s", path, exc)


# -- the reaper's side ----------------------------------------------------------------------


def kill_orphaned_tree(
    job_dir: Path, job_id: str, ranks: Iterable[tuple[int, int, float | None]]
) -> None:
    """After a job's supervisor died: kill whatever its ranks left on this host.

    `ranks`: (rank, pid, process start time) as the store recorded them."""
    ranks = list(ranks)
    record = _containment_record(job_dir)
    if record is None:
        return  # another machine's processes: not ours to kill
    deadline = time.monotonic() + KILL_DEADLINE
    for _rank, pid, started in ranks:
        if process_is(pid, started):  # the leader is still the very rank: its group is ours
            killpg(pid)
    starts = [s for _r, _p, s in ranks if s]
    _kill_contained(record, job_id, min(starts) - START_SLACK if starts else None, deadline)


def kill_left_behind(job_dir: Path, job_id: str, since: float) -> None:
    """kill_orphaned_tree without the store (a sentinel may not open it: SQLite's locks do
    not survive a fork): the job's cgroup, and its marked processes started after `since`
    (the ranks themselves died with their supervisor: PR_SET_PDEATHSIG)."""
    record = _containment_record(job_dir)
    if record is not None:
        _kill_contained(record, job_id, since, time.monotonic() + KILL_DEADLINE)


def _containment_record(job_dir: Path) -> dict | None:
    """The job's containment record, or None when its processes are another host's."""
    try:
        record = json.loads((Path(job_dir) / RECORD_NAME).read_text())
    except (OSError, ValueError):
        record = {}
    if not isinstance(record, dict) or record.get("host", this_host()) != this_host():
        return None
    return record


def _kill_contained(record: dict, job_id: str, since: float | None, deadline: float) -> None:
    cgroup = record.get("cgroup")
    if isinstance(cgroup, str) and _valid_job_cgroup(Path(cgroup), job_id):
        _kill_cgroup(Path(cgroup), deadline)
    if since is not None:
        _kill_marked(job_id, since, deadline)


def marked_processes(job_id: str, since: float) -> list[psutil.Process]:
    """Live processes of this user whose environment names the job and that started at or
    after `since` (what a job's ranks started, wherever they went)."""
    found = []
    me = os.getpid()
    uid = os.getuid()
    for proc in psutil.process_iter(["pid", "uids", "create_time"]):
        info = proc.info
        if info["pid"] == me or not info["uids"] or info["uids"].real != uid:
            continue
        if (info["create_time"] or 0) < since:
            continue
        try:
            if proc.environ().get("MLCLUSTER_JOB_ID") == job_id and _alive(proc):
                found.append(proc)
        except psutil.Error:
            continue
    return found


def _kill_marked(job_id: str, since: float, deadline: float) -> None:
    while time.monotonic() < deadline:
        left = marked_processes(job_id, since)
        if not left:
            return
        _kill_pids(p.pid for p in left)
        psutil.wait_procs(left, timeout=0.5)
