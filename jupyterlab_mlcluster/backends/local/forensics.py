"""A local attempt's forensics (jobs/forensics/), beside its gang (gang.py): the stall watch
fed by what the gang already sees (output lines, progress, its CPU samples), the stacks of
the ranks still alive taken before they are stopped (a cancel, the timeout, a failing rank,
a stall with --on-stall cancel) and kept with the job, and a failing rank's peers read
while the failing rank waits for it (runtime/stackdump.py's pause).

A session's gang (session.py) has none of it: its ranks idle between cells by design.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import TYPE_CHECKING

from ...jobs import forensics
from ...jobs.sessions import is_session_holder
from ...runtime.stackdump import FAILURE_ACK_ENV, STACKS_FILE_ENV

if TYPE_CHECKING:
    from .gang import Gang

# A read here holds up the supervisor's loop (a stop, a failing rank's exit): shorter than
# an asking front end's.
SUPERVISOR_READ_TIMEOUT = 5.0


class GangForensics(forensics.AttemptForensics):
    def __init__(self, gang: Gang):
        super().__init__(gang.ctx, not is_session_holder(gang.ctx.job))
        self.gang = gang
        self.config = gang.ctx.config
        # The failing rank's peers, read while it waited (on_failing), for _fail_fast.
        self.at_failure: forensics.StackReport | None = None
        self.acks: list = []

    # -- the ranks' environment -------------------------------------------------------

    def rank_env(self, rank: int) -> dict[str, str]:
        if not self.enabled:
            return {}
        env = {FAILURE_ACK_ENV: str(self._ack_path(rank))}
        if self.config.stacks_helper:
            env[STACKS_FILE_ENV] = str(forensics.helper_file(self.job_dir, rank))
        return env

    def _ack_path(self, rank: int) -> Path:
        return self.job_dir / f"rank-{rank}.failing-{self.gang.attempt}"

    # -- what the gang sees -----------------------------------------------------------

    def started(self) -> None:
        now = time.monotonic()
        for p in self.gang.ranks:
            self.stall.active(p.rank, now)
        self.stall.clear()  # an earlier attempt's

    def on_failing(self, rank: int) -> None:
        """A rank's code raised and it waits: read its live peers first, then let it go."""
        try:
            if not self.stopping and self.at_failure is None:
                peers = [r for r in self.live() if r != rank]
                self.at_failure = self.read(peers, "failed") if peers else None
        finally:
            path = self._ack_path(rank)
            with contextlib.suppress(OSError):
                path.touch()
                self.acks.append(path)

    # -- at the end -------------------------------------------------------------------

    def before_stop(self, why: str, exclude: set[int] | None = None) -> str:
        """The live ranks' stacks, kept, before the gang stops them: the clause for the
        job's reason or error ('' when none were left or it is off)."""
        if not self.enabled:
            return ""
        report = self.at_failure if why == "failed" else None
        if report is None:
            live = [r for r in self.live() if r not in (exclude or set())]
            report = self.read(live, why) if live else None
        self.stopping = True
        return self.kept(report, why)

    def read(self, ranks: list[int], why: str) -> forensics.StackReport:
        targets = [
            forensics.Target(
                p.rank,
                p.pid,
                p.create_time,
                forensics.helper_file(self.job_dir, p.rank) if self.config.stacks_helper else None,
            )
            for p in self.gang.ranks
            if p.rank in ranks
        ]
        report = forensics.read_targets(
            self.gang.ctx.job.id,
            targets,
            reader=self.config.stacks_reader,
            py_spy_setting=self.config.py_spy,
            why=why,
            timeout=SUPERVISOR_READ_TIMEOUT,
        )
        return report

    def close(self) -> None:
        for path in self.acks:
            with contextlib.suppress(OSError):
                path.unlink()

    def live(self) -> list[int]:
        return [
            p.rank for p in self.gang.ranks if p.rank not in self.gang.done and p.poll() is None
        ]
