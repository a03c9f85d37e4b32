"""Spares: a job's supervisor and its ranks, forked from the zygote before the job comes.

A fork of the zygote costs in proportion to what it has mapped (its page tables are copied,
then every page either side writes): with transformers preloaded, 10-30 ms a fork on two
busy cores, and a job's start had them in a row on its critical path: its supervisor, then
one per rank, each rank waiting for the forks before it. So each generation keeps a spare
supervisor, forked while the zygote is idle, which forks as many spare ranks as the last warm
job had (its size is hinted in the pool directory, HINT_FILE). A job then costs a pipe write:
the zygote hands the job's message to the spare supervisor (zygote.py), and the supervisor
hands each rank's assignment (environment, cwd, payload) to a spare rank (take()).

A spare is a fresh torchrun worker in every way a program can see: until its assignment it
runs nothing but a blocking read, and everything of the job is set after it, by
rank.become_rank, exactly as in a rank forked at the job: environment (the rank's variables
too), cwd, sys.path, seeds, thread count, stdio, the supervisor tie and the job's cgroup. (Only
its process start time is earlier.)

Nothing leaks: a spare waits on a pipe whose only writer is its parent, so it exits as soon
as the parent does, however the parent died; the zygote closes its spare's pipe when it
stops. A supervisor kills and reaps the spare ranks its job does not use once the job's last
rank was handed out, or when its ranks start cold or as a session's (they read stdin). No GPU:
spares are forks of the CUDA-clean zygote and run nothing until the job's
CUDA_VISIBLE_DEVICES is set. Memory: a spare's PSS is counted in its generation's
(warm_pool_max_memory, `mlcluster pool status`).
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
from dataclasses import dataclass
from pathlib import Path

from .place import _open_private

HINT_FILE = "spare-ranks"
MAX_SPARE_RANKS = 16  # a bound on what a hint (a file the user could edit) makes us fork


@dataclass
class SpareRank:
    """A spare rank as its supervisor holds it: its pid and the parent ends of its pipes."""

    pid: int
    stdout: int
    stderr: int
    control: int
    assign: int  # the write end: the rank's assignment, then end of file

    def fds(self) -> tuple[int, int, int, int]:
        return (self.stdout, self.stderr, self.control, self.assign)


# In a spare supervisor (and the job's supervisor it becomes): the ranks waiting for a job.
_ranks: list[SpareRank] = []
# In a supervisor forked from a zygote: the pool directory and the hint it was forked with,
# so that the job's size is written only when it differs.
_pool_dir: Path | None = None
_hinted: int | None = None
_noted = False


def set_pool(directory: Path, hinted: int | None) -> None:
    """In a supervisor forked from the zygote serving `directory`: where to leave the hint."""
    global _pool_dir, _hinted, _noted
    _pool_dir, _hinted, _noted = directory, hinted, False


def read_hint(directory: Path) -> int:
    """How many spare ranks to fork: the size of the last warm job (0: none seen yet)."""
    try:
        fd = os.open(directory / HINT_FILE, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        with os.fdopen(fd) as f:
            value = int(f.read(16))
    except (OSError, ValueError):
        return 0
    return max(0, min(value, MAX_SPARE_RANKS))


def _note_size(env: dict[str, str]) -> None:
    """Once per supervisor: leave its job's size as the next spares' hint."""
    global _noted
    if _noted or _pool_dir is None:
        return
    _noted = True
    size = env.get("WORLD_SIZE", "")
    if not size.isdigit() or int(size) == _hinted:
        return
    with contextlib.suppress(OSError):
        tmp = _pool_dir / f"{HINT_FILE}.{os.getpid()}.tmp"
        with os.fdopen(_open_private(tmp, os.O_WRONLY | os.O_TRUNC), "w") as f:
            f.write(size)
        os.replace(tmp, _pool_dir / HINT_FILE)


def read_all(fd: int) -> bytes:
    """Everything written to a pipe until its writer closes it (b"": closed unwritten)."""
    chunks = []
    while chunk := os.read(fd, 1 << 16):
        chunks.append(chunk)
    return b"".join(chunks)


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def fork_ranks(count: int, job: int) -> None:
    """In a spare supervisor: fork `count` spare ranks, fewer if the job (readable on `job`)
    comes first: its supervisor forks the rest after its set-up, as without spares, rather
    than make the job wait for spares."""
    for _ in range(count):
        if select.select([job], [], [], 0)[0]:
            return
        _ranks.append(_fork_rank())


def held_fds() -> list[int]:
    """The descriptors of the spare ranks this process holds (kept open when it becomes
    the job's supervisor)."""
    return [fd for spare in _ranks for fd in spare.fds()]


def _fork_rank() -> SpareRank:
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    control_r, control_w = os.pipe()
    assign_r, assign_w = os.pipe()
    supervisor = os.getpid()
    pid = os.fork()
    if pid == 0:  # the spare rank
        status = 1
        try:
            os.setsid()
            # Only its parent may hold the write end of its assignment pipe: then the
            # parent's end, however it comes, is this spare's end of file.
            for fd in (out_r, err_r, control_r, assign_w, *held_fds()):
                os.close(fd)
            devnull = os.open(os.devnull, os.O_RDONLY)
            os.dup2(devnull, 0)
            os.dup2(out_w, 1)
            os.dup2(err_w, 2)
            for fd in (devnull, out_w, err_w):
                os.close(fd)
            data = read_all(assign_r)
            if data:
                assignment = json.loads(data)
                env = dict(assignment["env"])
                env["MLCLUSTER_REPORT"] = f"fd:{control_w}"
                env["MLCLUSTER_SUPERVISOR_PID"] = str(supervisor)
                from .rank import become_rank

                status = become_rank(env, assignment["cwd"], assignment["payload"])
            else:
                status = 0  # not needed: its supervisor let it go
        except BaseException:  # noqa: BLE001 - say it on the rank's stderr
            import traceback

            traceback.print_exc()
        finally:
            os._exit(status)
    for fd in (out_w, err_w, control_w, assign_r):
        os.close(fd)
    return SpareRank(pid, out_r, err_r, control_r, assign_w)


def take(env: dict[str, str], cwd: str | None, payload_path: str) -> SpareRank | None:
    """In a warm supervisor: a spare rank given this rank's assignment (None: no spare is
    left; fork one). After the job's last rank, the spares it does not need are released."""
    _note_size(env)
    taken = None
    while _ranks and taken is None:
        spare = _ranks.pop(0)
        data = json.dumps({"env": env, "cwd": cwd, "payload": payload_path}).encode()
        try:
            write_all(spare.assign, data)
            os.close(spare.assign)
            taken = spare
        except OSError:  # it died meanwhile (killed by hand): the next one, or a fork
            _discard(spare)
    rank, size = env.get("RANK", ""), env.get("WORLD_SIZE", "")
    if rank.isdigit() and size.isdigit() and int(rank) + 1 >= int(size):
        release()
    return taken


def release() -> None:
    """Kill and reap every spare rank still waiting: the job does not need them."""
    while _ranks:
        _discard(_ranks.pop())


def _discard(spare: SpareRank) -> None:
    for fd in spare.fds():
        with contextlib.suppress(OSError):
            os.close(fd)
    with contextlib.suppress(ProcessLookupError):
        os.kill(spare.pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(spare.pid, 0)
