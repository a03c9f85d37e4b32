"""`mlcluster sweeps|schedule|scheduler`: a sweep's trials, scheduled trainings (cron) and
the daemon that fires their due ticks."""

from __future__ import annotations

import argparse
import json
import os
import time

from ..jobs.model import SpecError
from ..jobs.options import (
    JOB_ARGUMENTS,
    SCHEDULE_ARGUMENTS,
    schedule_options_from_args,
    spec_from_args,
)
from ..presentation import format_age, text_table
from .command_line import JSON, Command, arg, job_service
from .following import FollowedJob, handle_interrupts
from .run_command import SCRIPT, script_payload

_GRACE_NOT_SCHEDULED = (
    "--grace is not kept with a schedule: its runs use MLClusterConfig.kill_grace_period"
)


def cmd_sweeps(args: argparse.Namespace) -> int:
    from ..jobs.experiments.sweep import experiments, sweep_handle

    service = job_service()
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
    from ..jobs.experiments import scheduler as sched
    from ..jobs.experiments.schedules import next_tick

    service = job_service()
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
    from ..jobs.experiments.schedules import check_name, check_timezone, run_name
    from ..jobs.model import JobSpec
    from ..runtime.payload import Payload

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
    return FollowedJob(service, record.id).run()


def cmd_scheduler(args: argparse.Namespace) -> int:
    import signal
    import threading

    from ..jobs.experiments.scheduler import Clock, Scheduler

    scheduler = Scheduler(job_service(), Clock(args.clock))
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
    from ..jobs.service import _current_user as user

    return user()


_NAME = arg("name", help="the schedule's name")

SCHEDULE_COMMANDS = (
    Command(
        "add",
        "register a script to run on a cron schedule",
        arguments=(
            arg("--cron", required=True, help='cron expression, e.g. "0 2 * * *"'),
            *JOB_ARGUMENTS,
            *SCHEDULE_ARGUMENTS,
            *SCRIPT,
        ),
    ),
    Command("list", "list schedules", arguments=(JSON,)),
    Command("pause", "stop firing (runs in progress go on)", arguments=(_NAME,)),
    Command("resume", "fire again from the next tick", arguments=(_NAME,)),
    Command("delete", "forget the schedule (its runs' jobs stay)", arguments=(_NAME,)),
    Command("runs", "the schedule's runs", arguments=(_NAME, JSON)),
    Command(
        "submit",
        "submit a schedule's stored job now and follow it (what its CronJob's pod runs)",
        arguments=(
            arg("--schedule", required=True, help="the schedule's name"),
            arg("--timezone", default="UTC", help="the schedule's time zone"),
            arg("--spec", required=True, help="the job spec (JSON file)"),
            arg("--payload", required=True, help="the job's payload (pickle file)"),
        ),
    ),
)

COMMANDS = (
    Command(
        "sweeps",
        "list sweeps, or show one sweep's trials",
        cmd_sweeps,
        (arg("sweep", nargs="?", help="a sweep id: its trials table"), JSON),
    ),
    Command("schedule", "scheduled trainings (cron)", cmd_schedule, subcommands=SCHEDULE_COMMANDS),
    Command(
        "scheduler",
        "fire due schedules until stopped (a daemon)",
        cmd_scheduler,
        (
            arg("--interval", type=float, default=10.0, help="seconds between passes (default 10)"),
            arg(
                "--clock",
                default=None,
                metavar="START@SPEED",
                help="simulated time for tests and dry runs: epoch or ISO START, SPEED x real time",
            ),
            arg("--once", action="store_true", help="one pass, then exit"),
        ),
    ),
)
