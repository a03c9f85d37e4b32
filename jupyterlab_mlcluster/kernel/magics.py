"""`%%distributed` and its line magics.

    %%distributed --workers 4 --push model_fn --pull losses
    ...cell code, run on every rank...

The cell is validated and submitted to the JobService (any backend; the magic does not
know which), then followed by a JobMonitor in the cell's output. In a kernel with
IPython's autoawait on, the cell is rewritten into an awaited call, so the kernel keeps
handling widget messages (the monitor's Cancel button) while the job runs; elsewhere the
plain blocking cell magic does the same work.

One execution of the cell is kernel/cell_run.py; what loading the extension starts in the
process (background threads, the fork hook) kernel/extension.py; what the line magics print
is presentation.py and kernel/tables.py, the monitor kernel/monitor.py.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

from IPython.core import magic_arguments
from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class

from .. import backends  # noqa: F401 - a front end fills the backend registry
from ..jobs.options import (
    JOB_ARGUMENTS,
    SCHEDULE_ARGUMENTS,
    SESSION_ARGUMENTS,
    SWEEP_ARGUMENTS,
)
from .cell_run import CellRun, in_kernel
from .extension import KernelExtension
from .submitter import KernelSubmitter

CELL_MAGIC = "%%distributed"


def _job_arguments(func):
    """Apply the shared job options (and the magic's own) as magic_arguments."""
    own = [
        (
            ("--push",),
            {
                "default": None,
                "metavar": "VAR[,VAR...]",
                "help": "send these kernel variables to every rank",
            },
        ),
        (
            ("--pull",),
            {
                "default": None,
                "metavar": "VAR[,VAR...]",
                "help": "bring rank 0's variables back into the kernel",
            },
        ),
        (
            ("--schedule",),
            {
                "default": None,
                "metavar": "CRON",
                "help": 'register the cell to run on this cron schedule (e.g. "0 2 * * *") '
                "instead of now",
            },
        ),
    ]
    arguments = JOB_ARGUMENTS + SESSION_ARGUMENTS + own + SWEEP_ARGUMENTS + SCHEDULE_ARGUMENTS
    for flags, kwargs in reversed(arguments):
        func = magic_arguments.argument(*flags, **kwargs)(func)
    return magic_arguments.magic_arguments()(func)


@magics_class
class DistributedMagics(Magics):
    def __init__(self, shell):
        super().__init__(shell)
        self._service = None
        self.submitter = KernelSubmitter(shell)

    @property
    def service(self):
        if self._service is None:
            from ..jobs.service import JobService

            self._service = JobService()
        return self._service

    @_job_arguments
    @cell_magic
    def distributed(self, line: str, cell: str) -> Any:
        """Run this cell as a distributed job: every rank runs it with a torchrun-compatible
        environment (RANK, WORLD_SIZE, MASTER_ADDR, ...), live monitor below.

        Rank 0's last expression is the cell's value; --pull brings variables back instead.
        A failing rank fails the job (the others are stopped); interrupting the kernel
        cancels it."""
        return CellRun(self, line, cell).run_blocking()

    async def distributed_async(self, line: str, cell: str) -> Any:
        """What a %%distributed cell becomes under autoawait (see transform_cell)."""
        return await CellRun(self, line, cell).run_async()

    @magic_arguments.magic_arguments()
    @magic_arguments.argument(
        "--state", action="append", help="only jobs in this state (repeatable)"
    )
    @magic_arguments.argument(
        "--limit", type=int, default=20, help="how many, newest first (default 20)"
    )
    @magic_arguments.argument(
        "--flat", action="store_true", help="every job a row (default: cells and trials grouped)"
    )
    @magic_arguments.argument(
        "--parent", help="only the cells of this session or trials of this sweep"
    )
    @line_magic
    def distributed_jobs(self, line: str) -> None:
        """List distributed jobs (from every kernel, the CLI and the sidebar): a session's
        cells under the session, a sweep's trials under the sweep, as `mlcluster jobs`."""
        from IPython.display import display

        from ..jobs.listing import grouped_jobs
        from .tables import groups_bundle, jobs_bundle

        args = magic_arguments.parse_argstring(self.distributed_jobs, line)
        if args.flat or args.parent:
            records, total = self.service.list(
                states=args.state, parent=args.parent, limit=args.limit
            )
            display(jobs_bundle(records, total), raw=True)
            return
        self.service.reap()
        groups, total = grouped_jobs(self.service.store, states=args.state, limit=args.limit)
        display(groups_bundle(groups, total), raw=True)

    @magic_arguments.magic_arguments()
    @magic_arguments.argument("action", choices=["list", "stop", "restart"])
    @magic_arguments.argument("name", nargs="?", help="the session (stop, restart)")
    @line_magic
    def distributed_session(self, line: str) -> None:
        """Your sessions (%%distributed --session NAME): list them, stop one (its ranks end,
        their slots and GPUs are freed), or restart one (fresh ranks: its state is lost)."""
        from ..jobs.model import SpecError
        from ..presentation import session_command

        args = magic_arguments.parse_argstring(self.distributed_session, line)
        try:
            print(session_command(self.service, args.action, args.name))
        except SpecError as exc:
            raise UsageError(f"%distributed_session: {exc}") from None

    @magic_arguments.magic_arguments()
    @magic_arguments.argument("job", help="job id or name")
    @magic_arguments.argument("--rank", type=int, default=None, help="only this rank")
    @magic_arguments.argument(
        "--tail", type=int, default=None, help="only the last N lines of each rank"
    )
    @line_magic
    def distributed_logs(self, line: str) -> None:
        """Print a job's logs, each line prefixed with its rank."""
        args = magic_arguments.parse_argstring(self.distributed_logs, line)
        record = self._find(args.job)
        try:
            lines, _ = self.service.logs(record.id, args.rank, tail=args.tail)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        from ..jobs.log_text import LogText

        for item, text in LogText().lines(lines):
            stream = sys.stderr if item["stream"] == "stderr" else sys.stdout
            print(text, file=stream)

    @magic_arguments.magic_arguments()
    @magic_arguments.argument(
        "job", nargs="?", default=None, help="job id or name (default: your newest running job)"
    )
    @magic_arguments.argument("--rank", type=int, default=None, help="only this rank")
    @magic_arguments.argument("--native", action="store_true", help="native (C) frames too")
    @magic_arguments.argument("--json", action="store_true", help="the whole answer as JSON")
    @line_magic
    def distributed_stacks(self, line: str) -> None:
        """Where a job's ranks are: every thread's stack of every rank, identical ones folded
        ('ranks 0, 2: all_reduce ← step (train.py:42)'). A finished job: the stacks it kept."""
        from ..jobs.model import SpecError
        from ..jobs.storage.store import UnknownJob
        from ..presentation import stacks_command

        args = magic_arguments.parse_argstring(self.distributed_stacks, line)
        try:
            text, _ = stacks_command(
                self.service, args.job, rank=args.rank, native=args.native, as_json=args.json
            )
        except (SpecError, UnknownJob) as exc:
            raise UsageError(f"%distributed_stacks: {exc}") from None
        print(text)

    @magic_arguments.magic_arguments()
    @magic_arguments.argument("job", help="job id or name")
    @magic_arguments.argument(
        "--purge", action="store_true", help="also forget the job and its logs"
    )
    @line_magic
    def distributed_cancel(self, line: str) -> None:
        """Cancel a job: every rank is stopped."""
        args = magic_arguments.parse_argstring(self.distributed_cancel, line)
        record = self._find(args.job)
        from ..jobs.service import JobStillRunning

        try:
            after = self.service.cancel(
                record.id, purge=args.purge, by="user (%distributed_cancel)"
            )
        except JobStillRunning as exc:  # e.g. its supervisor on another host still beats
            raise UsageError(str(exc)) from None
        print(f"{record.id} purged" if after is None else f"{record.id} {after.state}")

    @magic_arguments.magic_arguments()
    @magic_arguments.argument("job", help="job id or name")
    @magic_arguments.argument(
        "--no-wait", action="store_true", help="show the monitor and return at once"
    )
    @line_magic
    def distributed_attach(self, line: str) -> Any:
        """Show the live monitor of a job (e.g. after a kernel restart, or one submitted from
        the sidebar/CLI) and wait for it; interrupting detaches without cancelling."""
        return self._attach(line, blocking=True)

    async def distributed_attach_async(self, line: str) -> Any:
        return await self._attach_async(line)

    def _attach_monitor(self, line: str):
        from ..jobs.handle import Job
        from .monitor import JobMonitor

        args = magic_arguments.parse_argstring(self.distributed_attach, line)
        record = self._find(args.job)
        monitor = JobMonitor(self.service, record.id, terminal=not in_kernel(self.shell))
        monitor.show()
        return args, monitor, Job(self.service, record.id)

    def _attach(self, line: str, blocking: bool) -> Any:
        args, monitor, job = self._attach_monitor(line)
        if args.no_wait:
            monitor.follow_in_background()
            return job
        try:
            record = monitor.follow_blocking()
        except KeyboardInterrupt:
            print(
                f"detached from {job.id}; it keeps running "
                f"(%distributed_cancel {job.id} to stop it)"
            )
            return job
        return self._attached_result(record)

    async def _attach_async(self, line: str) -> Any:
        args, monitor, job = self._attach_monitor(line)
        if args.no_wait:
            monitor.follow_in_background()
            return job
        try:
            record = await monitor.follow_async()
        except (KeyboardInterrupt, asyncio.CancelledError):
            print(
                f"detached from {job.id}; it keeps running "
                f"(%distributed_cancel {job.id} to stop it)"
            )
            return job
        return self._attached_result(record)

    def _attached_result(self, record) -> Any:
        self.service.raise_for_state(record)
        kind, value = self.service.take_result(record.id)
        if kind == "pull":
            assert self.shell is not None  # a magic runs in its shell
            self.shell.user_ns.update(value)
            return None
        return value

    def _find(self, job: str):
        from ..jobs.storage.store import UnknownJob

        try:
            return self.service.get(job)
        except UnknownJob:
            raise UsageError(f"no job {job!r} (see %distributed_jobs)") from None


def transform_cell(lines: list[str]) -> list[str]:
    """Input transformer: under autoawait, run %%distributed (and a lone
    %distributed_attach) as an awaited call so the kernel stays responsive."""
    if not lines:
        return lines
    shell = _shell()
    if shell is None or not getattr(shell, "autoawait", False) or not in_kernel(shell):
        return lines
    first = lines[0]
    head, _, rest = first.rstrip("\n").partition(" ")
    registry = "get_ipython().magics_manager.registry['DistributedMagics']"
    if head == CELL_MAGIC:
        body = "".join(lines[1:])
        return [f"await {registry}.distributed_async({rest!r}, {body!r})\n"]
    if head == "%distributed_attach" and not "".join(lines[1:]).strip():
        return [f"await {registry}.distributed_attach_async({rest!r})\n"]
    return lines


def _shell():
    from IPython import get_ipython

    return get_ipython()


def load_ipython_extension(ipython) -> None:
    from .debug_magic import DebugMagics

    magics = DistributedMagics(ipython)
    ipython.register_magics(magics)
    ipython.register_magics(DebugMagics(ipython, lambda: magics.service, magics.submitter.origin))
    # ipykernel reads `_last_traceback` after a failed cell, but sets it only in run_cell,
    # which an awaited %%distributed cell (transform_cell) never passes through: without
    # this, a kernel whose first failing cell is one of ours never replies.
    if not hasattr(ipython, "_last_traceback"):
        ipython._last_traceback = None
    if transform_cell not in ipython.input_transformers_cleanup:
        ipython.input_transformers_cleanup.append(transform_cell)
    KernelExtension.in_this_process().load(ipython)


def unload_ipython_extension(ipython) -> None:
    if transform_cell in ipython.input_transformers_cleanup:
        ipython.input_transformers_cleanup.remove(transform_cell)
    KernelExtension.unload(ipython)
