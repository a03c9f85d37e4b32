"""A Slurm job's forensics (jobs/forensics/): its ranks' stacks, and the stall watch.

Stacks: each rank reports its pid when it starts (rank.py's "started" record). Where that
pid is a process of this machine that is that very rank (its environment names the job and
the rank: a pid means nothing on another node), py-spy reads it. Otherwise (another node,
ptrace refused, no py-spy) the rank's own helper (runtime/stackdump.py, armed by rank.py to
write `rank-N.stacks` in the attempt's directory) is woken through Slurm itself: `scancel
--signal=USR2` reaches every task of the job's steps on whatever node it runs. That is only
sent when every running rank's helper is armed (an unarmed rank would die of SIGUSR2), and
the answer says which reader read each rank.

Stalls: the attempt feeds the watch what it already sees (each output line, progress report
and the rank's own CPU figure) and judges it at each metrics turn, as the local gang does.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil

from ...jobs import forensics
from ...jobs.forensics.readers import (
    HELPER_READER,
    HELPER_SETTLE,
    HELPER_TIMEOUT,
    READ_TIMEOUT,
    parse_faulthandler,
)
from ...jobs.model import RankState
from ...jobs.sessions import is_session_holder
from ...runtime.stackdump import main_ident_path
from . import script
from .commands import SlurmError

if TYPE_CHECKING:
    from ...config import MLClusterConfig
    from ...jobs.record import JobRecord
    from ...jobs.storage.store import JobStore
    from .commands import SlurmCommands

SIGNAL_READER = f"{HELPER_READER} via scancel --signal=USR2"
SUPERVISOR_READ_TIMEOUT = 5.0
# A Slurm rank reports its own CPU (rank.py: nobody samples a task from outside), its
# reporter thread included: asleep, it reads 0.5-1 % at 2 s samples, which the local rule
# (1 %) would take for activity, so the stall would come and go. A rank at work reads far more.
SELF_REPORTED_CPU_PERCENT = 3.0


def helper_path(attempt_dir: str | Path, rank: int) -> Path:
    return Path(script.rank_file(str(attempt_dir), rank, "stacks"))


def latest_attempt_dir(store: JobStore, job_id: str) -> Path | None:
    base = store.job_dir(job_id) / "slurm"
    numbers = []
    with contextlib.suppress(OSError):
        for entry in base.iterdir():
            name = entry.name
            if name.startswith("attempt-") and name[8:].isdigit():
                numbers.append(int(name[8:]))
    return base / f"attempt-{max(numbers)}" if numbers else None


def local_rank(pid: int | None, slurm_id: str | None, rank: int) -> float | None:
    """The start time of `pid` when it is, on this machine, task `rank` of Slurm job
    `slurm_id` (as srun started it: the environment it was started with); None where it is
    not (another node's pid, an ended rank, a process we may not look at)."""
    if not pid or not slurm_id:
        return None
    try:
        proc = psutil.Process(pid)
        env = proc.environ()
        if env.get("SLURM_JOB_ID") != slurm_id or env.get("SLURM_PROCID") != str(rank):
            return None
        if proc.status() == psutil.STATUS_ZOMBIE:
            return None
        return proc.create_time()
    except (psutil.Error, OSError):
        return None


def read_stacks(
    commands: SlurmCommands,
    config: MLClusterConfig,
    job: JobRecord,
    slurm_id: str | None,
    attempt_dir: Path | None,
    ranks: list[int] | None,
    *,
    native: bool = False,
    why: str = "asked",
    timeout: float = READ_TIMEOUT,
) -> forensics.StackReport:
    """The ranks' stacks: py-spy where the rank's process is here, else its own helper."""
    began = time.monotonic()
    wanted = list(range(job.spec.workers)) if ranks is None else list(ranks)
    records = {r.rank: r for r in job.ranks}
    missing: dict[int, str] = {}
    local: list[forensics.Target] = []
    remote: dict[int, str] = {}  # rank -> why py-spy could not read it
    reader = config.stacks_reader
    for rank in wanted:
        record = records.get(rank)
        if record is None or record.state != RankState.RUNNING or not record.pid:
            ended = record is not None and RankState(record.state).final
            missing[rank] = "it has ended" if ended else "it has no process yet"
            continue
        started = local_rank(record.pid, slurm_id, rank)
        if started is not None and reader != "helper":
            local.append(forensics.Target(rank, record.pid, started))
        else:
            remote[rank] = (
                "the helper was asked for (MLClusterConfig.stacks_reader)"
                if reader == "helper"
                else f"its process (pid {record.pid} on {record.host or 'its node'}) is not "
                "on this machine"
            )
    report = forensics.read_targets(
        job.id,
        local,
        native=native,
        reader="py-spy",
        py_spy_setting=config.py_spy,
        missing=missing,
        why=why,
        timeout=timeout,
    )
    if reader != "py-spy":
        for target in local:  # py-spy refused (ptrace): the helper may still answer
            if target.rank in report.missing:
                remote[target.rank] = f"py-spy: {report.missing.pop(target.rank)}"
    if remote:
        if native:
            for rank in remote:
                report.missing[rank] = forensics.NATIVE_UNAVAILABLE + " for a rank on another node"
        elif reader == "py-spy":
            report.missing.update(remote)
        else:
            live = [r.rank for r in job.ranks if r.state == RankState.RUNNING]
            for rank, stacks in _read_helpers(commands, slurm_id, attempt_dir, remote, live):
                if isinstance(stacks, str):
                    report.missing[rank] = stacks
                else:
                    stacks.pid = records[rank].pid
                    report.ranks.append(stacks)
    report.seconds = time.monotonic() - began
    return report


def _read_helpers(
    commands: SlurmCommands,
    slurm_id: str | None,
    attempt_dir: Path | None,
    remote: dict[int, str],
    live: list[int],
) -> list[tuple[int, forensics.RankStacks | str]]:
    """(rank, RankStacks or why not) of each `remote` rank, from its helper, woken by one
    scancel --signal=USR2 to the job's tasks."""
    if not slurm_id or attempt_dir is None:
        return [(rank, f"{why}; the job has no Slurm allocation") for rank, why in remote.items()]
    unarmed = [r for r in live if not helper_path(attempt_dir, r).exists()]
    if unarmed:
        text = (
            f"rank {', '.join(map(str, unarmed))}'s stack helper is not armed "
            "(MLClusterConfig.stacks_helper): SIGUSR2 would end it"
        )
        return [(rank, f"{why}; {text}") for rank, why in remote.items()]
    files = {}
    for rank in remote:
        path = helper_path(attempt_dir, rank)
        with contextlib.suppress(OSError):
            fd = os.open(path, os.O_RDWR | getattr(os, "O_NOFOLLOW", 0) | os.O_CLOEXEC)
            os.ftruncate(fd, 0)
            files[rank] = fd
    try:
        try:
            commands.signal(slurm_id, "USR2")
        except SlurmError as exc:
            return [(rank, f"{why}; scancel --signal=USR2: {exc}") for rank, why in remote.items()]
        out: list[tuple[int, forensics.RankStacks | str]] = []
        deadline = time.monotonic() + HELPER_TIMEOUT
        for rank, why in remote.items():
            handle = files.get(rank)
            dumped = _settled(handle, deadline) if handle is not None else None
            if not dumped:
                out.append((rank, f"{why}; its helper wrote nothing within {HELPER_TIMEOUT:g} s"))
                continue
            main: int | None = None
            with contextlib.suppress(OSError, ValueError):
                main = int(main_ident_path(helper_path(attempt_dir, rank)).read_text().strip())
            threads = parse_faulthandler(dumped, main)
            out.append((rank, forensics.RankStacks(rank, None, f"{SIGNAL_READER}; {why}", threads)))
        return out
    finally:
        for fd in files.values():
            os.close(fd)


def _settled(fd: int, deadline: float) -> str | None:
    size, since = 0, time.monotonic()
    while time.monotonic() < deadline:
        now_size = os.fstat(fd).st_size
        if now_size != size:
            size, since = now_size, time.monotonic()
        elif size and time.monotonic() - since >= HELPER_SETTLE:
            return os.pread(fd, size, 0).decode("utf-8", "replace")
        time.sleep(0.01)
    return None


class AttemptForensics(forensics.AttemptForensics):
    """One attempt's stall watch and the stacks it keeps (the supervisor's side)."""

    def __init__(self, attempt: Any):
        super().__init__(
            attempt.ctx, not is_session_holder(attempt.ctx.job), SELF_REPORTED_CPU_PERCENT
        )
        self.attempt = attempt

    def watching(self) -> bool:
        """The ranks' own CPU figures count once the allocation runs."""
        return super().watching() and self.attempt.running

    def before_stop(self, why: str) -> str:
        """The live ranks' stacks, kept, before the attempt stops them: the clause for the
        job's reason ('' when none were read or it is off)."""
        if not self.enabled or not self.attempt.running or self.stopping:
            return ""
        self.stopping = True
        live = self.live()
        if not live:
            return ""
        return self.kept(self.read(live, why), why)

    def read(self, ranks: list[int], why: str) -> forensics.StackReport:
        attempt = self.attempt
        attempt.rank_updates.flush(force=True)  # the ranks' pids, as the store has them
        job = attempt.ctx.store.get_job(attempt.ctx.job.id)
        return read_stacks(
            attempt.commands,
            attempt.ctx.config,
            job,
            attempt.slurm_id,
            attempt.dir,
            ranks,
            why=why,
            timeout=SUPERVISOR_READ_TIMEOUT,
        )

    def live(self) -> list[int]:
        a = self.attempt
        return [r for r in sorted(a.started_ranks) if r not in a.exits]
