"""`mlcluster`: the command line, on the same engine as the magic and the REST API.

mlcluster run --workers 4 train.py [args]   run and stream rank-prefixed output
mlcluster jobs                              list jobs
mlcluster logs JOB [--rank R] [--follow]
mlcluster cancel JOB [--purge]
mlcluster stacks JOB [--rank R] [--native] [--json]   where every rank is (its stacks)
mlcluster run --sweep lr=0.1,0.01 train.py  one job per trial (params as --lr=0.1 arguments)
mlcluster sweeps [SWEEP]                    list sweeps, or one sweep's trials table
mlcluster schedule add --cron "0 2 * * *" --name nightly train.py
mlcluster schedule list|pause|resume|delete|runs [NAME]
mlcluster scheduler                         fire due schedules (a daemon)
mlcluster controller ...                    the Kubernetes notebook-controller
mlcluster manifests                         YAML a platform team applies

What the CLI and the kernel both print is presentation.py; the job options are jobs/options.py.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from . import backends  # noqa: F401 - a front end fills the backend registry
from .jobs.log_text import LogText
from .jobs.model import JobState, SpecError
from .jobs.options import (
    JOB_ARGUMENTS,
    SCHEDULE_ARGUMENTS,
    SWEEP_ARGUMENTS,
    add_arguments,
    grace_from_args,
    schedule_options_from_args,
    spec_from_args,
    sweep_from_args,
)
from .presentation import format_age, format_jobs_table, session_command, text_table

# As torchrun: 1 for a job that failed or was interrupted (Ctrl-C, SIGTERM, cancelled).
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_CANCELLED = 1

# A command's arguments: (flags, add_argument's keywords) each.
Arguments = Sequence[tuple[tuple[str, ...], dict[str, Any]]]


def _service():
    from .jobs.service import JobService

    return JobService()


@dataclass(frozen=True)
class Command:
    """One subcommand of `mlcluster`: its line in `--help`, its arguments (in order) or
    subcommands of its own, and what runs it. A command that `hands_over` has a command line
    of its own: it is listed here and gets the rest of the line unparsed."""

    name: str
    help: str
    run: Callable[[argparse.Namespace], int] | None = None
    arguments: Arguments = ()
    subcommands: Sequence[Command] = ()
    hands_over: Callable[[list[str]], int] | None = None

    def add_to(self, parsers: Any, *, whole: bool = True) -> None:
        """Its parser among `parsers` (an add_subparsers' action); not `whole`: its line in
        `--help` only (a command not asked for: its arguments would never parse anything)."""
        parser = parsers.add_parser(self.name, help=self.help)
        if not whole:
            return
        add_arguments(parser, self.arguments)
        if self.subcommands:
            inner = parser.add_subparsers(dest=f"{self.name}_command", required=True)
            for command in self.subcommands:
                command.add_to(inner)


class CommandLine:
    """`mlcluster`: its commands, the parser they make, and running the one asked for, with
    the errors a user can act on said in a line (status 2: usage) instead of a traceback."""

    def __init__(self, commands: Sequence[Command]):
        self.commands = {command.name: command for command in commands}

    def parser(self, asked: str | None = None) -> argparse.ArgumentParser:
        """The whole parser, or (`asked`: the line's first word, a command) one whose other
        commands are their `--help` lines only: a command's start pays for its own
        arguments, not the ~120 of every command (argparse's and gettext's work)."""
        parser = argparse.ArgumentParser(
            prog="mlcluster", description="Distributed jobs from JupyterLab and the shell."
        )
        parsers = parser.add_subparsers(dest="command", required=True)
        for command in self.commands.values():
            command.add_to(parsers, whole=asked is None or command.name == asked)
        return parser

    def main(self, argv: list[str] | None = None) -> int:
        argv = sys.argv[1:] if argv is None else list(argv)
        command = self.commands.get(argv[0]) if argv else None
        if command is not None and command.hands_over is not None:
            return command.hands_over(argv[1:])
        # The first word names the command (the top parser has no options but --help).
        args = self.parser(command.name if command is not None else None).parse_args(argv)
        from .jobs.storage.store import UnsafeStore

        run = self.commands[args.command].run
        assert run is not None  # every command that is parsed here runs
        try:
            return run(args)
        except (SpecError, ValueError, UnsafeStore) as exc:
            print(f"mlcluster: error: {exc}", file=sys.stderr)
            return EXIT_USAGE
        except KeyError as exc:  # UnknownJob
            print(f"mlcluster: error: {exc}", file=sys.stderr)
            return EXIT_USAGE
        except KeyboardInterrupt:  # before there was a job to cancel (a submitted one follows us)
            return EXIT_CANCELLED
        except BrokenPipeError:
            return _reader_gone()
        except Exception as exc:
            # A full disk under the store is the user's to fix, not a traceback to read.
            from .config import get_config
            from .jobs.storage.fsinfo import is_storage_full, no_space_text

            store = get_config().store_dir
            if not is_storage_full(exc, store):
                raise
            print(f"mlcluster: error: {no_space_text(store)} ({exc})", file=sys.stderr)
            return EXIT_FAILED


def _reader_gone() -> int:
    """Whoever read our output left (`mlcluster jobs | head`): end quietly, as Unix tools
    do (killed by SIGPIPE: status 141), not with a traceback. What is still buffered for
    stdout goes nowhere: flushed at exit into the closed pipe it would raise again."""
    with contextlib.suppress(OSError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    return 128 + signal.SIGPIPE


# -- run -------------------------------------------------------------------------------

_GRACE_NOT_SCHEDULED = (
    "--grace is not kept with a schedule: its runs use MLClusterConfig.kill_grace_period"
)


_TERMINATING = (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)


class _Terminated(KeyboardInterrupt):
    """SIGTERM, SIGHUP or SIGQUIT while following a job: handled like Ctrl-C."""


def _raise_terminated(signum, frame) -> None:
    raise _Terminated(signal.Signals(signum).name)


def handle_interrupts() -> None:
    """Ctrl-C, SIGTERM, SIGHUP and SIGQUIT (torchrun's set) stop the job and end this command,
    even when it was started with SIGINT ignored (a background job of a non-interactive shell
    inherits SIG_IGN)."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for signum in _TERMINATING:
        signal.signal(signum, _raise_terminated)


def cmd_run(args: argparse.Namespace) -> int:
    if not args.no_wait:
        handle_interrupts()
    service = _service()
    spec = spec_from_args(args, default_backend=service.config.default_backend)
    grace = grace_from_args(args)
    sweep = sweep_from_args(args)
    payload = script_payload(args, spec)
    origin = {"kind": "cli", "command": " ".join(sys.argv[:1] + sys.argv[1:])[:500]}
    attach = None if args.no_wait else os.getpid()
    preload = _script_preload(service.config, payload)
    if sweep is not None:
        from .jobs.experiments.sweep import submit_sweep

        handle = submit_sweep(
            service,
            spec,
            payload,
            sweep,
            origin=origin,
            attach_to_pid=attach,
            preload=preload,
            grace=grace,
        )
        if args.no_wait:
            print(handle.id)
            return 0
        return follow_sweep(handle, quiet=args.quiet)
    record = service.submit(
        spec, payload, origin=origin, attach_to_pid=attach, preload=preload, grace=grace
    )
    if args.no_wait:
        print(record.id)
        return 0
    return follow_job(service, record.id, quiet=args.quiet)


def _script_preload(config, payload) -> list[str]:
    """What the warm pool may learn from the script: its top imports (read, never run)."""
    if not (config.warm_pool and config.warm_pool_learn):
        return []
    from .jobs.warm import preload

    path = payload.filename
    if payload.kind == "module":
        import importlib.util

        try:
            spec = importlib.util.find_spec(payload.filename)
        except (ImportError, ValueError):
            return []
        path = spec.origin if spec is not None else None
    return preload.script_modules(path) if path else []


def script_payload(args: argparse.Namespace, spec):
    """The script (or -m module) and its arguments as a payload; a missing script is a
    SpecError. Kubernetes pods do not share this filesystem: the source itself travels."""
    from .runtime.payload import Payload

    if args.module:
        return Payload(kind="module", filename=args.script, argv=list(args.args))
    path = os.path.abspath(args.script)
    if not os.path.isfile(path):
        raise SpecError(f"no such script: {args.script}")
    if spec.backend == "kubernetes":
        with open(path, encoding="utf-8") as f:
            return Payload(kind="code", source=f.read(), argv=list(args.args))
    return Payload(kind="script", filename=path, argv=list(args.args))


def follow_sweep(handle, *, quiet: bool = False) -> int:
    """Print each trial's state changes, then the trials table; Ctrl-C cancels every trial.
    Exit status 0 if every trial succeeded, 1 if any failed."""
    seen: set[str] = set()
    try:
        while True:
            trials = handle.trials
            for t in trials:
                key = f"{t.job_id}:{t.state}"
                if key not in seen and not quiet:
                    seen.add(key)
                    print(f"trial {t.index} {t.params} {t.state} ({t.job_id})", flush=True)
            if all(JobState(t.state).final for t in trials):
                break
            time.sleep(0.2)
            handle._service.reap()
    except KeyboardInterrupt:
        for signum in (signal.SIGINT, *_TERMINATING):
            signal.signal(signum, signal.SIG_IGN)
        print(f"\nmlcluster: cancelling sweep {handle.id} ...", file=sys.stderr)
        handle.cancel()
        return EXIT_CANCELLED
    print(repr(handle))
    return 0 if all(t.state == "succeeded" for t in handle.trials) else EXIT_FAILED


def _cancel_and_follow(
    service, job_id: str, cursor, *, by: str, quiet: bool, view: LogText | None = None
) -> int:
    """Cancel the job, printing what its ranks print while they stop (a SIGTERM handler
    saving a checkpoint says so), until it is final; then why it ended."""
    from .jobs.follow import JobFollower

    view = view or LogText()
    service.cancel(job_id, wait=False, by=by)
    deadline = time.monotonic() + service.job_grace(job_id) + 10.0
    follower = JobFollower(service.store, job_id, cursor=cursor, reap=service.reap)
    for step in follower.steps():
        if not quiet:
            _print_lines(step.lines, view)
        if time.monotonic() > deadline:  # a wedged supervisor: the waiting cancel kills it
            service.cancel(job_id, by=by)
            follower.changed_here()
            deadline = float("inf")
    record = step.record
    print(f"mlcluster: job {job_id} {record.reason or record.state}", file=sys.stderr)
    return EXIT_CANCELLED


def follow_job(service, job_id: str, *, quiet: bool = False) -> int:
    """Stream rank-prefixed output until the job ends; Ctrl-C cancels it."""
    from .jobs.follow import JobFollower

    follower = JobFollower(service.store, job_id, reap=service.reap)
    view = LogText()
    try:
        for step in follower.steps():
            if not quiet:
                _print_lines(step.lines, view)
    except KeyboardInterrupt as interrupt:
        # A second signal while cancelling must not leave the job behind: ignore them now.
        for signum in (signal.SIGINT, *_TERMINATING):
            signal.signal(signum, signal.SIG_IGN)
        why = f" ({interrupt})" if isinstance(interrupt, _Terminated) else ""
        print(f"\nmlcluster: cancelling job {job_id}{why} ...", file=sys.stderr)
        by = (
            f"{interrupt} to mlcluster run (pid {os.getpid()})"
            if isinstance(interrupt, _Terminated)
            else "user (Ctrl-C of mlcluster run)"
        )
        return _cancel_and_follow(service, job_id, follower.cursor, by=by, quiet=quiet, view=view)
    record = service.store.get_job(job_id)
    if record.state == JobState.SUCCEEDED:
        return 0
    if record.state == JobState.CANCELLED:
        print(f"mlcluster: job {job_id} {record.reason or 'cancelled'}", file=sys.stderr)
        return EXIT_CANCELLED
    print(f"mlcluster: job {job_id} failed: {record.error}", file=sys.stderr)
    report = service.error_report(job_id)
    if report and report.get("traceback"):
        print(
            f"--- traceback of rank {record.failed_rank} ---\n{report['traceback'].rstrip()}",
            file=sys.stderr,
        )
    return EXIT_FAILED


def _print_lines(lines: list[dict[str, Any]], view: LogText) -> None:
    """Each line in the log's order, also when stdout and stderr share one file (`> out
    2>&1`): a stream is flushed before the other is written (a block-buffered stdout came
    out in lumps after the stderr lines written since)."""
    last = None
    for line, text in view.lines(lines):
        stream = sys.stderr if line["stream"] == "stderr" else sys.stdout
        if last is not None and stream is not last:
            last.flush()
        stream.write(f"{text}\n")
        last = stream
    sys.stdout.flush()
    sys.stderr.flush()


# -- jobs / logs / cancel -------------------------------------------------------------------


def cmd_jobs(args: argparse.Namespace) -> int:

    service = _service()
    if not (args.flat or args.parent or args.json):
        from .jobs.listing import grouped_jobs
        from .presentation import format_job_groups

        service.reap()
        groups, total = grouped_jobs(
            service.store, states=args.state, backend=args.backend, limit=args.limit
        )
        print(format_job_groups(groups))
        shown = sum(1 for g in groups if g.head is not None)
        if total > shown:
            print(f"({total - shown} older jobs not shown; --limit to see more, --flat: every row)")
        return 0
    records, total = service.list(
        states=args.state, backend=args.backend, parent=args.parent, limit=args.limit
    )
    if args.json:
        print(json.dumps([r.to_json() for r in records], indent=2))
        return 0
    print(format_jobs_table(records))
    if total > len(records):
        print(f"({total - len(records)} older jobs not shown; --limit to see more)")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from .export import ExportError, job_material, write_export
    from .export.build import build
    from .export.verify import check_variables
    from .jobs.owner import current_user

    try:
        material = job_material(_service(), args.job, owner=current_user())
        check_variables(material)
        written = write_export(build(material, args.target, image=args.image), args.output)
    except ExportError as exc:
        print(f"mlcluster: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    print(f"job {material.record.id} exported as {args.target} to {args.output}:")
    for path in written:
        print(f"  {path}")
    return 0


def cmd_logs(args: argparse.Namespace) -> int:
    service = _service()
    job = service.get(args.job)
    view = LogText()
    if args.follow:
        try:
            for line in service.follow_logs(job.id, args.rank):
                _print_lines([line], view)
        except KeyboardInterrupt:
            return 0
        return 0
    cursor = None
    while True:
        lines, cursor = service.logs(job.id, args.rank, cursor)
        if not lines:
            return 0
        _print_lines(lines, view)


def cmd_stacks(args: argparse.Namespace) -> int:
    """Exit 1 when a rank asked for could not be read (the answer says which, and why)."""
    from .presentation import stacks_command

    text, complete = stacks_command(
        _service(), args.job, rank=args.rank, native=args.native, as_json=args.json
    )
    print(text)
    return 0 if complete else EXIT_FAILED


def cmd_metrics(args: argparse.Namespace) -> int:
    from .jobs.storage.series import series_text

    service = _service()
    job = service.get(args.job)
    print(series_text(service.store.job_dir(job.id), csv=args.csv), end="")
    return 0


def cmd_cancel(args: argparse.Namespace) -> int:
    from .jobs.service import JobStillRunning

    service = _service()
    job = service.get(args.job)
    try:
        record = service.cancel(job.id, purge=args.purge, by="user (mlcluster cancel)")
    except JobStillRunning as exc:
        print(f"mlcluster: error: {exc}", file=sys.stderr)
        return 1
    if record is None:
        print(f"{job.id} purged")
    else:
        print(f"{record.id} {record.state}")
    return 0


def cmd_session(args: argparse.Namespace) -> int:
    """`mlcluster session list|stop NAME|restart NAME|debug NAME`: this user's sessions
    only."""
    if args.action == "debug":  # pdb's prompt in this terminal (jobs/session_debug.py)
        from .jobs.owner import current_user
        from .jobs.session_debug import debug

        def say(text: str) -> None:
            sys.stdout.write(text)
            sys.stdout.flush()

        print(
            debug(
                _service(),
                current_user(),
                args.name,
                args.rank,
                origin={"kind": "cli"},
                ask=input,
                say=say,
            )
        )
        return 0
    print(session_command(_service(), args.action, args.name, as_json=args.json))
    return 0


def cmd_pool(args: argparse.Namespace) -> int:
    from .config import get_config
    from .jobs import warm

    config = get_config()
    if args.action == "start":
        if warm.ensure_zygote(config) is None:
            print(
                "mlcluster: the warm pool did not come up (see its log in the pool directory)",
                file=sys.stderr,
            )
            return EXIT_FAILED
    elif args.action == "stop":
        print("stopped" if warm.stop(config) else "no warm pool is running")
        return 0
    report = warm.pool_status(config)
    generations = report["generations"]
    if not generations:
        print(
            f"no warm pool is running (enabled: {config.warm_pool}; it starts with the first job)"
        )
        return 0
    mib = 1024 * 1024
    bound = (
        f"bound {report['max_memory'] / mib:.0f} MiB (warm_pool_max_memory)"
        if report["max_memory"]
        else "no bound"
    )
    print(
        f"warm pool: {len(generations)} generation{'s' if len(generations) != 1 else ''}, "
        f"{report['pss_bytes'] / mib:.0f} MiB PSS in all, {bound}"
    )
    for g in generations:
        size = g.get("size", 0)
        extra = size - len(g["modules"])
        modules = ", ".join(g["modules"]) or "-"
        if extra > 0:
            modules += f" (+{extra} submodules)"
        pss = f"{g['pss_bytes'] / mib:.0f} MiB PSS, " if g.get("pss_bytes") else ""
        uss = f", {g['uss_bytes'] / mib:.0f} MiB of its own (USS)" if g.get("uss_bytes") else ""
        # (names only: an env-keyed generation's values may be a token)
        keyed = f" keyed by {', '.join(sorted(g['overlay']))}" if g.get("overlay") else ""
        print(
            f"generation pid {g['pid']}{'' if g['current'] else ' (outdated environment)'}"
            f"{keyed}: modules {modules}; memory {pss}{g['rss_bytes'] / mib:.0f} MiB RSS{uss}; "
            f"CUDA initialised: {g['cuda_initialized']}; up {g['uptime']:.0f}s, "
            f"idle {g['idle']:.0f}s"
        )
    for name, reason in sorted(report["refused"].items()):
        print(f"refused: {name} ({reason})")
    return 0


# -- sweeps / schedules ---------------------------------------------------------------------


def cmd_sweeps(args: argparse.Namespace) -> int:

    from .jobs.experiments.sweep import experiments, sweep_handle

    service = _service()
    store = experiments(service)
    if args.sweep:
        store.get_sweep(args.sweep)  # UnknownSweep (a KeyError) -> usage error
        handle = sweep_handle(service, args.sweep)
        print(json.dumps(handle.to_json(), indent=2) if args.json else repr(handle))
        return 0
    stored = store.list_sweeps()
    sweeps = [sweep_handle(service, row["id"]).to_json() for row in stored]
    if args.json:
        print(json.dumps(sweeps, indent=2))
        return 0
    rows = [("ID", "NAME", "STATE", "TRIALS", "BEST", "AGE")]
    now = time.time()
    for s, row in zip(sweeps, stored, strict=False):
        counts: dict[str, int] = {}
        for t in s["trials"]:
            counts[t["state"]] = counts.get(t["state"], 0) + 1
        rows.append(
            (
                s["id"],
                s["name"],
                s["state"],
                ", ".join(f"{n} {state}" for state, n in counts.items()),
                "" if s["best"] is None else f"trial {s['best']}",
                format_age(now - row["created"]),
            )
        )
    print(text_table(rows) if sweeps else "no sweeps")
    return 0


def _when(ts: float | None) -> str:
    import datetime

    if ts is None:
        return "-"
    return datetime.datetime.fromtimestamp(ts, datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")


def cmd_schedule(args: argparse.Namespace) -> int:

    from .jobs.experiments import scheduler as sched
    from .jobs.experiments.schedules import next_tick

    service = _service()
    store = sched.experiments(service)
    action = args.schedule_command
    if action == "add":
        spec = spec_from_args(args, default_backend=service.config.default_backend)
        if args.grace is not None:
            raise SpecError(_GRACE_NOT_SCHEDULED)
        payload = script_payload(args, spec)
        options = schedule_options_from_args(args, spec)
        origin = {"kind": "cli", "cwd": os.getcwd()}
        row = sched.create_schedule(
            service,
            spec=spec,
            payload=payload,
            options=options,
            owner=_current_user(),
            origin=origin,
        )
        print(
            f"schedule {row['name']} added: {row['cron']} ({row['timezone']}), next run "
            f"{_when(next_tick(row['cron'], row['timezone'], row['last_tick']))}"
        )
        return 0
    if action == "list":
        rows = store.list_schedules()
        if args.json:
            print(json.dumps([sched.schedule_json(service, r) for r in rows], indent=2))
            return 0
        table = [("NAME", "CRON", "TIMEZONE", "CONCURRENCY", "STATE", "LAST RUN", "NEXT RUN")]
        for r in rows:
            j = sched.schedule_json(service, r)
            table.append(
                (
                    r["name"],
                    r["cron"],
                    r["timezone"],
                    r["concurrency"],
                    "paused" if r["suspended"] else "active",
                    j["last_run"]["job_name"] if j["last_run"] else "-",
                    "-" if r["suspended"] else _when(sched.next_run(r)),
                )
            )
        print(text_table(table) if rows else "no schedules")
        return 0
    if action == "submit":
        return cmd_schedule_submit(args, service)
    if action in ("pause", "resume"):
        sched.pause(service, args.name, action == "pause")
        print(f"{args.name} {'paused' if action == 'pause' else 'resumed'}")
        return 0
    if action == "delete":
        sched.delete(service, args.name)
        print(f"{args.name} deleted")
        return 0
    runs = store.runs(args.name) if store.get_schedule(args.name) else []
    if args.json:
        print(json.dumps(runs, indent=2))
        return 0
    run_rows = [("TICK", "JOB", "STATE", "OUTCOME")]
    for r in runs:
        run_rows.append((_when(r["tick"]), r["job_id"] or "-", r["state"] or "-", r["outcome"]))
    print(text_table(run_rows) if runs else f"{args.name} has not run yet")
    return 0


def cmd_schedule_submit(args: argparse.Namespace, service) -> int:
    """One run of a schedule from its stored spec and payload (a CronJob's pod): an ordinary
    job named <schedule>-<time>, followed to its end (the pod's exit status is the run's)."""
    from .jobs.experiments.schedules import check_name, check_timezone, run_name
    from .jobs.model import JobSpec
    from .runtime.payload import Payload

    handle_interrupts()
    name = check_name(args.schedule)
    timezone = check_timezone(args.timezone)
    with open(args.spec, encoding="utf-8") as f:
        stored = json.load(f)
    if not isinstance(stored, dict):
        raise SpecError(f"{args.spec}: not a job spec")
    # Validated again: the file crossed a boundary (a Secret anyone with access could edit).
    spec = JobSpec.from_options(
        {k: v for k, v in stored.items() if k in JobSpec.FIELDS and v is not None},
        default_backend=service.config.default_backend,
    )
    tick = time.time() // 60 * 60  # the CronJob's tick: its pods start within the minute
    spec.name = run_name(name, tick, timezone)
    with open(args.payload, "rb") as f:
        payload = Payload.loads(f.read())
    record = service.submit(
        spec,
        payload,
        origin={"kind": "schedule", "schedule": name, "tick": tick},
        attach_to_pid=os.getpid(),
    )
    print(f"mlcluster: schedule {name} submitted job {record.id} ({record.name})", flush=True)
    return follow_job(service, record.id)


def cmd_scheduler(args: argparse.Namespace) -> int:
    import signal
    import threading

    from .jobs.experiments.scheduler import Clock, Scheduler

    scheduler = Scheduler(_service(), Clock(args.clock))
    if args.once:
        for item in scheduler.fire_due():
            print(json.dumps(item), flush=True)
        return 0
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    print(f"mlcluster scheduler: firing due schedules every {args.interval:g}s", flush=True)
    scheduler.run_forever(
        args.interval, stop, on_fire=lambda item: print(json.dumps(item), flush=True)
    )
    return 0


def _current_user() -> str:
    from .jobs.service import _current_user as user

    return user()


# -- the command table ---------------------------------------------------------------------


def _arg(*flags: str, **keywords: Any) -> tuple[tuple[str, ...], dict[str, Any]]:
    """One argument of a command, as `add_argument(*flags, **keywords)` adds it."""
    return flags, keywords


_JSON = _arg("--json", action="store_true", help="print JSON")
_JOB = _arg("job", help="job id or name")
_RANK = _arg("--rank", type=int, default=None, help="only this rank")
_NAME = _arg("name", help="the schedule's name")
_SCRIPT = (
    _arg("-m", dest="module", action="store_true", help="run SCRIPT as a module, like python -m"),
    _arg("script", help="the Python script (or module with -m)"),
    _arg("args", nargs=argparse.REMAINDER, help="arguments for the script"),
)


def _controller(argv: list[str]) -> int:
    from notebook_controller.cli import run_controller

    return run_controller(argv)


def _manifests(argv: list[str]) -> int:
    from notebook_controller.cli import print_manifests

    return print_manifests(argv)


SCHEDULE_COMMANDS = (
    Command(
        "add",
        "register a script to run on a cron schedule",
        arguments=(
            _arg("--cron", required=True, help='cron expression, e.g. "0 2 * * *"'),
            *JOB_ARGUMENTS,
            *SCHEDULE_ARGUMENTS,
            *_SCRIPT,
        ),
    ),
    Command("list", "list schedules", arguments=(_JSON,)),
    Command("pause", "stop firing (runs in progress go on)", arguments=(_NAME,)),
    Command("resume", "fire again from the next tick", arguments=(_NAME,)),
    Command("delete", "forget the schedule (its runs' jobs stay)", arguments=(_NAME,)),
    Command("runs", "the schedule's runs", arguments=(_NAME, _JSON)),
    Command(
        "submit",
        "submit a schedule's stored job now and follow it (what its CronJob's pod runs)",
        arguments=(
            _arg("--schedule", required=True, help="the schedule's name"),
            _arg("--timezone", default="UTC", help="the schedule's time zone"),
            _arg("--spec", required=True, help="the job spec (JSON file)"),
            _arg("--payload", required=True, help="the job's payload (pickle file)"),
        ),
    ),
)

COMMANDS = (
    Command(
        "run",
        "run a script (or -m module) on N ranks",
        cmd_run,
        (*JOB_ARGUMENTS, *SWEEP_ARGUMENTS, *_SCRIPT),
    ),
    Command(
        "sweeps",
        "list sweeps, or show one sweep's trials",
        cmd_sweeps,
        (_arg("sweep", nargs="?", help="a sweep id: its trials table"), _JSON),
    ),
    Command("schedule", "scheduled trainings (cron)", cmd_schedule, subcommands=SCHEDULE_COMMANDS),
    Command(
        "scheduler",
        "fire due schedules until stopped (a daemon)",
        cmd_scheduler,
        (
            _arg(
                "--interval", type=float, default=10.0, help="seconds between passes (default 10)"
            ),
            _arg(
                "--clock",
                default=None,
                metavar="START@SPEED",
                help="simulated time for tests and dry runs: epoch or ISO START, SPEED x real time",
            ),
            _arg("--once", action="store_true", help="one pass, then exit"),
        ),
    ),
    Command(
        "jobs",
        "list jobs",
        cmd_jobs,
        (
            _arg("--state", action="append", help="only jobs in this state (repeatable)"),
            _arg("--backend", help="only jobs of this backend"),
            _arg(
                "--limit", type=int, default=50, help="at most this many (newest first; default 50)"
            ),
            _JSON,
            _arg(
                "--flat",
                action="store_true",
                help="every job a row (not a session's cells or a sweep's trials under it)",
            ),
            _arg("--parent", help="only the jobs under this session job or sweep"),
        ),
    ),
    Command(
        "export",
        "write what runs a job again outside the notebook (script, sbatch, ...)",
        cmd_export,
        (
            _JOB,
            _arg(
                "--as",
                dest="target",
                required=True,
                choices=["script", "sbatch", "trainjob", "pytorchjob"],
            ),
            _arg("-o", "--output", required=True, help="a new (or empty) directory"),
            _arg("--image", help="the image of a Kubernetes export (default: the job's)"),
        ),
    ),
    Command(
        "logs",
        "print a job's logs",
        cmd_logs,
        (
            _JOB,
            _RANK,
            _arg("--follow", "-f", action="store_true", help="keep printing until the job ends"),
        ),
    ),
    Command(
        "stacks",
        "where a job's ranks are: every thread's stack of every rank, folded",
        cmd_stacks,
        (
            _arg("job", help="job id or name (a finished job: the stacks it kept)"),
            _RANK,
            _arg("--native", action="store_true", help="native (C) frames too"),
            _arg("--json", action="store_true", help="print the whole answer as JSON"),
        ),
    ),
    Command(
        "metrics",
        "the series a job logged (mlc.log, TensorBoard)",
        cmd_metrics,
        (_JOB, _arg("--csv", action="store_true", help="every point, as CSV")),
    ),
    Command(
        "cancel",
        "cancel a job (all ranks)",
        cmd_cancel,
        (_JOB, _arg("--purge", action="store_true", help="also forget the job and its logs")),
    ),
    Command(
        "session",
        "your sessions: live ranks that %%%%distributed --session cells run on",
        cmd_session,
        (
            _arg("action", choices=["list", "stop", "restart", "debug"]),
            _arg("name", nargs="?", help="the session (stop, restart, debug)"),
            _arg("--json", action="store_true", help="list: print JSON"),
            _arg(
                "--rank",
                type=int,
                default=None,
                help="debug: pdb on this rank's traceback of the last failed cell (default: the"
                " rank that failed first)",
            ),
        ),
    ),
    Command(
        "pool",
        "the warm pool of pre-started, CUDA-clean interpreters",
        cmd_pool,
        (_arg("action", choices=["status", "start", "stop"], nargs="?", default="status"),),
    ),
    Command(
        "controller",
        "run the notebook-controller (Kubernetes); --help for its options",
        hands_over=_controller,
    ),
    Command(
        "manifests",
        "print CRDs, RBAC, the controller Deployment, Istio objects as YAML",
        hands_over=_manifests,
    ),
)


def main(argv: list[str] | None = None) -> int:
    return CommandLine(COMMANDS).main(argv)


if __name__ == "__main__":
    sys.exit(main())
