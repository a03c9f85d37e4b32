"""`%%distributed` and its line magics.

    %%distributed --workers 4 --push model_fn --pull losses
    ...cell code, run on every rank...

The cell is validated and submitted to the JobService (any backend; the magic does not
know which), then followed by a JobMonitor in the cell's output. In a kernel with
IPython's autoawait on, the cell is rewritten into an awaited call, so the kernel keeps
handling widget messages (the monitor's Cancel button) while the job runs; elsewhere the
plain blocking cell magic does the same work.

Over 500 lines: one IPython Magics class, its cell magic and each line magic (jobs, logs,
sessions, the pool) with their argument handling; what they print is presentation.py and
kernel/tables.py, the monitor kernel/monitor.py.
"""

from __future__ import annotations

import asyncio
import keyword
import logging
import os
import sys
import threading
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
    grace_from_args,
    schedule_options_from_args,
    spec_from_args,
    sweep_from_args,
)
from ..jobs.owner import current_user

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


def _names(option: str, value: str | None) -> list[str]:
    if not value:
        return []
    names = [n.strip() for n in value.split(",") if n.strip()]
    for name in names:
        if not name.isidentifier() or keyword.iskeyword(name):
            raise UsageError(f"{option} {name}: not a Python variable name")
    return names


def _unquote(value: str | None) -> str | None:
    """'"0 2 * * *"' -> '0 2 * * *' (one pair of matching outer quotes)."""
    if value and len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        return value[1:-1]
    return value


def _in_kernel(shell) -> bool:
    return getattr(shell, "kernel", None) is not None


_noted_refusals: set[str] = set()


def _kernel_preload(config) -> list[str]:
    """The installed packages this kernel has imported, for the warm pool to learn (it
    preloads them in a new generation, so the next cell's ranks start with them imported);
    a package the pool refused is said once, in one line."""
    if not (config.warm_pool and config.warm_pool_learn):
        return []
    from ..jobs import warm
    from ..jobs.warm import preload

    learned = preload.kernel_modules()
    refused = warm.refused_modules()
    for top in sorted({name.partition(".")[0] for name in learned} & set(refused)):
        if top not in _noted_refusals:
            _noted_refusals.add(top)
            print(f"warm pool: {top} is not preloaded: {refused[top]}", file=sys.stderr)
    return learned


def _kernel_origin() -> dict[str, Any]:
    origin: dict[str, Any] = {"kind": "kernel"}
    try:
        from ipykernel.connect import get_connection_file

        name = os.path.basename(get_connection_file())
        if name.startswith("kernel-") and name.endswith(".json"):
            origin["kernel_id"] = name[len("kernel-") : -len(".json")]
    except Exception:  # noqa: BLE001 - not in a kernel (terminal IPython)
        origin["kind"] = "ipython"
    # jupyter_server tells kernels which notebook they serve (ipykernel also puts it in the
    # namespace as __session__; VS Code as __vsc_ipynb_file__).
    shell = _current_shell()
    user_ns = getattr(shell, "user_ns", None) or {}
    notebook = (
        os.environ.get("JPY_SESSION_NAME")
        or user_ns.get("__session__")
        or user_ns.get("__vsc_ipynb_file__")
    )
    if isinstance(notebook, str) and notebook:
        origin["notebook"] = notebook
    # The cell's number as the notebook shows it (In [7]): the running execution's result
    # holds it (IPython counts shell.execution_count up before the cell's code runs).
    # Unnamed jobs are named after it (jobs/grouping.py).
    running = getattr(getattr(shell, "displayhook", None), "exec_result", None)
    count = getattr(running, "execution_count", None)
    if isinstance(count, int) and count > 0:
        origin["cell"] = count
    origin["user"] = current_user()  # $MLCLUSTER_USER in a notebook pod (jobs/owner.py)
    return origin


def _current_shell() -> Any:
    try:
        from IPython import get_ipython

        return get_ipython()
    except ImportError:  # pragma: no cover - IPython is a dependency
        return None


WIDGET_DELAY = 0.25  # seconds


class CellRun:
    """One execution of a %%distributed cell: submit, follow, bring the result home."""

    def __init__(self, magics: DistributedMagics, line: str, cell: str):
        self.magics = magics
        self.shell = magics.shell
        self.line = line
        self.cell = cell
        self.monitor: Any = None  # a JobMonitor once submitted
        self.job_id: str | None = None
        self.args: Any = None  # the parsed options (an argparse.Namespace) once submitted
        self.sweep: Any = None  # a --sweep cell: the Sweep handle and its SweepMonitor
        self.sweep_monitor: Any = None
        self.schedule: dict[str, Any] | None = None  # a --schedule cell: its stored row

    @property
    def user_ns(self) -> dict[str, Any]:
        """The kernel's namespace (a magic always runs in a shell)."""
        assert self.shell is not None
        return self.shell.user_ns

    def submit(self):
        from ..jobs.model import SpecError
        from ..runtime.payload import Payload, PayloadError

        args = magic_arguments.parse_argstring(self.magics.distributed, self.line)
        # IPython's magic argument splitting keeps quotes: --schedule "0 2 * * *" must not.
        for option in ("schedule", "timezone", "starting_deadline"):
            setattr(args, option, _unquote(getattr(args, option)))
        if args.sweep:
            args.sweep = [_unquote(entry) for entry in args.sweep]
        self.args = args
        service = self.magics.service
        try:
            spec = spec_from_args(args, default_backend=service.config.default_backend)
        except SpecError as exc:
            raise UsageError(f"%%distributed: {exc}") from None
        if not self.cell.strip():
            raise UsageError(
                "%%distributed: the cell is empty; put the code to run on every rank below the "
                "magic"
            )
        try:
            compile("\n" + self.cell, "<%%distributed cell>", "exec")  # line 1: the magic
        except SyntaxError as exc:
            raise UsageError(
                f"%%distributed: the cell does not compile: {exc.msg} (line {exc.lineno})"
            ) from None
        push = {}
        for name in _names("--push", args.push):
            if name not in self.user_ns:
                raise UsageError(
                    f"%%distributed: --push {name}: name {name!r} is not defined in this kernel"
                )
            push[name] = self.user_ns[name]
        payload = Payload(
            kind="code",
            source=self.cell,
            first_line=2,  # the notebook counts the %%distributed line
            push=push,
            pull=_names("--pull", args.pull),
            cwd=os.getcwd(),
            sys_path=[p for p in sys.path if p == "" or os.path.isdir(p)],
        )
        try:
            sweep = sweep_from_args(args)
            grace = grace_from_args(args)
            if args.session is not None:
                if grace is not None:
                    raise SpecError(
                        "--grace is for one job; a session's ranks are stopped with "
                        "MLClusterConfig.kill_grace_period"
                    )
                return self.submit_to_session(args, payload, sweep)
            if args.schedule is not None:
                if sweep is not None:
                    raise SpecError("--schedule runs one job per tick; it cannot take --sweep")
                if grace is not None:
                    raise SpecError(
                        "--grace is not kept with a schedule: its runs use "
                        "MLClusterConfig.kill_grace_period"
                    )
                return self.register_schedule(spec, payload)
            if sweep is not None:
                return self.submit_sweep(spec, payload, sweep, grace)
            record = service.submit(
                spec,
                payload,
                origin=_kernel_origin(),
                preload=_kernel_preload(service.config),
                grace=grace,
            )
        except (SpecError, PayloadError) as exc:
            raise UsageError(f"%%distributed: {exc}") from None
        return self.follow(record)

    def submit_to_session(self, args, payload, sweep):
        """--session NAME: the cell runs on the session's live ranks (jobs/sessions.py)."""
        from ..jobs.grouping import default_name
        from ..jobs.model import SpecError
        from ..jobs.options import spec_options
        from ..jobs.sessions import submit_cell

        if sweep is not None or args.schedule is not None:
            raise SpecError(
                "--session runs the cell on live ranks; it cannot take --sweep or --schedule"
            )
        service = self.magics.service
        origin = _kernel_origin()
        options = spec_options(args)
        # A cell without --name is named after its notebook and number, not its session's
        # name (the session's job, its parent in lists, has that).
        options.setdefault("name", default_name("code", origin))
        record, note = submit_cell(
            service,
            args.session,
            options,
            payload,
            origin=origin,
            # Only a session that starts asks (a live one's ranks are running already).
            preload=lambda: _kernel_preload(service.config),
        )
        if note:
            print(note, file=sys.stderr)
        return self.follow(record)

    def follow(self, record):
        """Show the job's monitor; the handle the cell follows (or returns, --no-wait)."""
        from ..jobs.handle import Job
        from .monitor import JobMonitor

        service = self.magics.service
        args = self.args
        self.job_id = record.id
        if args.session is not None:  # (a rank paused at breakpoint() gets pdb's prompt)
            from .pause_prompt import PausingMonitor as JobMonitor
        self.monitor = JobMonitor(
            service,
            record.id,
            terminal=not _in_kernel(self.shell),
            quiet=args.quiet,
            # A cell that waits builds its widgets once the job has run a moment, off the
            # ranks' start; --no-wait builds them now (later display updates would lack the
            # cell's parent message once it has returned).
            widget_delay=0.0 if args.no_wait else WIDGET_DELAY,
        )
        self.monitor.show()
        return Job(service, record.id)

    def submit_sweep(self, spec, payload, sweep, grace=None):
        from ..jobs.experiments.sweep import submit_sweep
        from .sweep_monitor import SweepMonitor

        self.sweep = submit_sweep(
            self.magics.service,
            spec,
            payload,
            sweep,
            origin=_kernel_origin(),
            preload=_kernel_preload(self.magics.service.config),
            grace=grace,
        )
        self.sweep_monitor = SweepMonitor(
            self.sweep, terminal=not _in_kernel(self.shell), quiet=self.args.quiet
        )
        self.sweep_monitor.show()
        return self.sweep

    def register_schedule(self, spec, payload):
        from ..jobs.experiments.scheduler import create_schedule
        from ..jobs.experiments.schedules import next_tick

        args = self.args
        origin = _kernel_origin()
        row = create_schedule(
            self.magics.service,
            spec=spec,
            payload=payload,
            options=schedule_options_from_args(args, spec),
            owner=origin.get("user"),
            origin=origin,
        )
        self.schedule = row
        when = next_tick(row["cron"], row["timezone"], row["last_tick"])
        import datetime

        next_run = datetime.datetime.fromtimestamp(when, datetime.UTC)
        print(
            f"schedule {row['name']} registered: {row['cron']} ({row['timezone']}), "
            f"next run {next_run:%Y-%m-%d %H:%M} UTC; "
            f"mlcluster schedule runs {row['name']}"
        )

    def finish_sweep(self) -> Any:
        """The cell's value is the Sweep; --pull brings the best trial's variables back."""
        sweep = self.sweep
        if self.args.pull:
            best = sweep.best
            if best is None:
                print("no trial has a best metric; --pull brought nothing back")
            elif isinstance(best.value, dict):
                self.user_ns.update(best.value)
        return sweep

    def finish(self, record) -> Any:
        """The cell's value: pulled variables go into the namespace; else rank 0's last
        expression. A failed or cancelled job raises."""
        service = self.magics.service
        service.raise_for_state(record)
        kind, value = service.take_result(record.id)
        if kind == "pull":
            self.user_ns.update(value)
            return None
        return value

    def on_interrupt(self) -> None:
        if self.sweep is not None:
            self.sweep.cancel()
            self.sweep_monitor.finish()
            return
        if self.job_id is not None:
            self.magics.service.cancel(self.job_id, wait=True, by="user (kernel interrupt)")
            if self.monitor is not None:
                # What the ranks printed while stopping (a SIGTERM handler's last words).
                self.monitor.finish(drain=True)

    def _detached(self) -> bool:
        """--no-wait: the monitor keeps updating from a thread; the cell returns the handle."""
        if self.args.no_wait and not self.args.quiet:
            self.monitor.follow_in_background()
        return self.args.no_wait

    def _to_follow(self, job) -> tuple[Any, Any]:
        """(monitor, finish) when the cell waits: follow the monitor, then `finish` its
        result; (value, None) when the cell returns `value` at once (a schedule, --no-wait)."""
        if self.schedule is not None:
            return None, None
        if self.sweep is not None:
            if self.args.no_wait:
                return self.sweep, None
            return self.sweep_monitor, lambda _result: self.finish_sweep()
        if self._detached():
            return job, None
        return self.monitor, self.finish

    def _interrupted(self) -> KeyboardInterrupt:
        """Ctrl-C (or the kernel cancelling an async cell) cancels what the cell started;
        the cell then ends as an interrupted Python cell ends, with KeyboardInterrupt.
        ipykernel turns an interrupt of an awaited cell into asyncio.CancelledError: the
        user never asked for asyncio, so that must not surface, nor our frames (IPython
        shows an exception's own _render_traceback_ instead of its stack)."""
        self.on_interrupt()
        if self.sweep is not None:
            what = f"sweep {self.sweep.id} was cancelled"
        elif self.job_id is not None:
            what = f"job {self.job_id} was cancelled"
        else:
            what = "nothing was submitted"
        interrupt = KeyboardInterrupt(what)
        # IPython prints an exception's own _render_traceback_ when it has one.
        interrupt._render_traceback_ = lambda: [  # type: ignore[attr-defined]
            f"\x1b[31mKeyboardInterrupt\x1b[0m: {what}"
        ]
        return interrupt

    def run_blocking(self) -> Any:
        monitor, finish = self._to_follow(self.submit())
        if finish is None:
            return monitor
        try:
            result = monitor.follow_blocking()
        except KeyboardInterrupt:
            raise self._interrupted() from None
        return finish(result)

    async def run_async(self) -> Any:
        monitor, finish = self._to_follow(self.submit())
        if finish is None:
            return monitor
        try:
            result = await monitor.follow_async()
        except (KeyboardInterrupt, asyncio.CancelledError):
            raise self._interrupted() from None
        return finish(result)


@magics_class
class DistributedMagics(Magics):
    def __init__(self, shell):
        super().__init__(shell)
        self._service = None

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
        monitor = JobMonitor(self.service, record.id, terminal=not _in_kernel(self.shell))
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
    if shell is None or not getattr(shell, "autoawait", False) or not _in_kernel(shell):
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


# The extension's background threads in the kernel (the first cell's imports, the import
# learner). A fork of the kernel (accelerate's notebook_launcher, multiprocessing's 'fork')
# waits for them first, at most FORK_WAIT: a thread caught importing holds that module's
# import lock, which the forked child finds held forever (CPython re-creates only the global
# import lock in a child), so a child importing the same module would hang.
_BACKGROUND: list[threading.Thread] = []
FORK_WAIT = 5.0


def _start_background(target, *args: Any, name: str) -> threading.Thread:
    thread = threading.Thread(target=target, args=args, name=name, daemon=True)
    _BACKGROUND[:] = [t for t in _BACKGROUND if t.is_alive()]
    _BACKGROUND.append(thread)
    thread.start()
    return thread


def _before_fork() -> None:
    import time

    deadline = time.monotonic() + FORK_WAIT
    me = threading.current_thread()
    for thread in list(_BACKGROUND):
        if thread is not me:
            thread.join(max(0.0, deadline - time.monotonic()))


os.register_at_fork(before=_before_fork)


class _ImportLearner:
    """After each cell: if the kernel imported something since the last look, the warm pool
    may build a generation with it now, in a thread (a cell's reply never waits for it), so
    that the first %%distributed cell after `import transformers` is served warm."""

    def __init__(self, ipython):
        self.ipython = ipython
        self.seen = len(sys.modules)
        self.thread: threading.Thread | None = None

    def __call__(self, _result=None) -> None:
        if len(sys.modules) == self.seen or (self.thread and self.thread.is_alive()):
            return
        self.seen = len(sys.modules)
        magics = self.ipython.magics_manager.registry.get("DistributedMagics")
        if magics is None:
            return
        config = magics.service.config
        if not (config.warm_pool and config.warm_pool_learn):
            return
        self.thread = _start_background(self._learn, config, name="mlcluster-learn")

    @staticmethod
    def _learn(config) -> None:
        from ..jobs import warm
        from ..jobs.warm import preload

        try:
            warm.learn_ahead(config, preload.kernel_modules())
        except Exception:  # never in the user's way; the next job learns
            logging.getLogger("jupyterlab_mlcluster").debug("not learned", exc_info=True)


def load_ipython_extension(ipython) -> None:
    from .debug_magic import DebugMagics

    magics = DistributedMagics(ipython)
    ipython.register_magics(magics)
    ipython.register_magics(DebugMagics(ipython, lambda: magics.service, _kernel_origin))
    if not any(isinstance(f, _ImportLearner) for f in ipython.events.callbacks["post_run_cell"]):
        ipython.events.register("post_run_cell", _ImportLearner(ipython))
    # ipykernel reads `_last_traceback` after a failed cell, but sets it only in run_cell,
    # which an awaited %%distributed cell (transform_cell) never passes through: without
    # this, a kernel whose first failing cell is one of ours never replies.
    if not hasattr(ipython, "_last_traceback"):
        ipython._last_traceback = None
    # The kernel's environment as its pod started (if no one recorded it yet): Kubernetes
    # jobs' pods install what is pip-installed into it later (environment.py).
    _start_background(_record_environment, name="mlcluster-baseline")
    if transform_cell not in ipython.input_transformers_cleanup:
        ipython.input_transformers_cleanup.append(transform_cell)


# What a first %%distributed cell would otherwise import on the way (its submit, the local
# backend, the monitor, the payload's pickler: ~30-40 ms measured in a kernel), imported
# in the background as the extension loads, so the first cell costs what the next ones do.
_FIRST_CELL_MODULES = (
    "cloudpickle",
    "jupyterlab_mlcluster.jobs.service",
    "jupyterlab_mlcluster.jobs.storage.watch",
    "jupyterlab_mlcluster.backends.local.backend",
    "jupyterlab_mlcluster.kernel.monitor",
)


def _record_environment() -> None:
    import importlib

    for name in _FIRST_CELL_MODULES:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - an import the cell will then try (and report) itself
            logging.getLogger("jupyterlab_mlcluster").debug("not preimported: %s", name)

    from .. import environment
    from ..config import MLClusterConfig

    try:
        environment.record_baseline(MLClusterConfig().store_dir)
    except Exception:  # never in the way of the magics; nothing synced then
        logging.getLogger("jupyterlab_mlcluster").debug("baseline not recorded", exc_info=True)


def unload_ipython_extension(ipython) -> None:
    if transform_cell in ipython.input_transformers_cleanup:
        ipython.input_transformers_cleanup.remove(transform_cell)
    for callback in list(ipython.events.callbacks["post_run_cell"]):
        if isinstance(callback, _ImportLearner):
            ipython.events.unregister("post_run_cell", callback)
