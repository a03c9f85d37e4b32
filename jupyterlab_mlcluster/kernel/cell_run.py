"""One execution of a `%%distributed` cell (CellRun): its options checked, its job (or
session cell, sweep, schedule) submitted, its monitor followed, and its result brought into
the kernel's namespace; interrupting the kernel cancels what the cell started."""

from __future__ import annotations

import asyncio
import keyword
import os
import sys
from typing import TYPE_CHECKING, Any

from IPython.core import magic_arguments
from IPython.core.error import UsageError

from ..jobs.options import (
    grace_from_args,
    schedule_options_from_args,
    spec_from_args,
    sweep_from_args,
)

if TYPE_CHECKING:
    from .magics import DistributedMagics


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


def in_kernel(shell) -> bool:
    return getattr(shell, "kernel", None) is not None


_noted_refusals: set[str] = set()

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
                origin=self.magics.submitter.origin(),
                preload=self.magics.submitter.preload(service.config),
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
        origin = self.magics.submitter.origin()
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
            preload=lambda: self.magics.submitter.preload(service.config),
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
            terminal=not in_kernel(self.shell),
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
            origin=self.magics.submitter.origin(),
            preload=self.magics.submitter.preload(self.magics.service.config),
            grace=grace,
        )
        self.sweep_monitor = SweepMonitor(
            self.sweep, terminal=not in_kernel(self.shell), quiet=self.args.quiet
        )
        self.sweep_monitor.show()
        return self.sweep

    def register_schedule(self, spec, payload):
        from ..jobs.experiments.scheduler import create_schedule
        from ..jobs.experiments.schedules import next_tick

        args = self.args
        origin = self.magics.submitter.origin()
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
