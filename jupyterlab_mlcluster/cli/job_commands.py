"""`mlcluster jobs|export|logs|stacks|metrics|cancel`: reading, taking away and cancelling
jobs (what they print is presentation.py's, as the kernel's)."""

from __future__ import annotations

import argparse
import json
import sys

from ..presentation import format_jobs_table
from .command_line import EXIT_FAILED, EXIT_USAGE, JSON, Command, arg, job_service
from .following import LinePrinter

JOB = arg("job", help="job id or name")
RANK = arg("--rank", type=int, default=None, help="only this rank")


def cmd_jobs(args: argparse.Namespace) -> int:
    service = job_service()
    if not (args.flat or args.parent or args.json):
        from ..jobs.listing import grouped_jobs
        from ..presentation import format_job_groups

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
    from ..export import ExportError, job_material, write_export
    from ..export.build import build
    from ..export.verify import check_variables
    from ..jobs.owner import current_user

    try:
        material = job_material(job_service(), args.job, owner=current_user())
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
    service = job_service()
    job = service.get(args.job)
    printer = LinePrinter()
    if args.follow:
        try:
            for line in service.follow_logs(job.id, args.rank):
                printer.print([line])
        except KeyboardInterrupt:
            return 0
        return 0
    cursor = None
    while True:
        lines, cursor = service.logs(job.id, args.rank, cursor)
        if not lines:
            return 0
        printer.print(lines)


def cmd_stacks(args: argparse.Namespace) -> int:
    """Exit 1 when a rank asked for could not be read (the answer says which, and why)."""
    from ..presentation import stacks_command

    text, complete = stacks_command(
        job_service(), args.job, rank=args.rank, native=args.native, as_json=args.json
    )
    print(text)
    return 0 if complete else EXIT_FAILED


def cmd_metrics(args: argparse.Namespace) -> int:
    from ..jobs.storage.series import series_text

    service = job_service()
    job = service.get(args.job)
    print(series_text(service.store.job_dir(job.id), csv=args.csv), end="")
    return 0


def cmd_cancel(args: argparse.Namespace) -> int:
    from ..jobs.service import JobStillRunning

    service = job_service()
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


COMMANDS = (
    Command(
        "jobs",
        "list jobs",
        cmd_jobs,
        (
            arg("--state", action="append", help="only jobs in this state (repeatable)"),
            arg("--backend", help="only jobs of this backend"),
            arg(
                "--limit", type=int, default=50, help="at most this many (newest first; default 50)"
            ),
            JSON,
            arg(
                "--flat",
                action="store_true",
                help="every job a row (not a session's cells or a sweep's trials under it)",
            ),
            arg("--parent", help="only the jobs under this session job or sweep"),
        ),
    ),
    Command(
        "export",
        "write what runs a job again outside the notebook (script, sbatch, ...)",
        cmd_export,
        (
            JOB,
            arg(
                "--as",
                dest="target",
                required=True,
                choices=["script", "sbatch", "trainjob", "pytorchjob"],
            ),
            arg("-o", "--output", required=True, help="a new (or empty) directory"),
            arg("--image", help="the image of a Kubernetes export (default: the job's)"),
        ),
    ),
    Command(
        "logs",
        "print a job's logs",
        cmd_logs,
        (
            JOB,
            RANK,
            arg("--follow", "-f", action="store_true", help="keep printing until the job ends"),
        ),
    ),
    Command(
        "stacks",
        "where a job's ranks are: every thread's stack of every rank, folded",
        cmd_stacks,
        (
            arg("job", help="job id or name (a finished job: the stacks it kept)"),
            RANK,
            arg("--native", action="store_true", help="native (C) frames too"),
            arg("--json", action="store_true", help="print the whole answer as JSON"),
        ),
    ),
    Command(
        "metrics",
        "the series a job logged (mlc.log, TensorBoard)",
        cmd_metrics,
        (JOB, arg("--csv", action="store_true", help="every point, as CSV")),
    ),
    Command(
        "cancel",
        "cancel a job (all ranks)",
        cmd_cancel,
        (JOB, arg("--purge", action="store_true", help="also forget the job and its logs")),
    ),
)
