"""`mlcluster`: the command line, on the same engine as the magic and the REST API.

mlcluster run --workers 4 train.py [args]   run and stream rank-prefixed output
mlcluster jobs                              list jobs
mlcluster logs JOB [--rank R] [--follow]
mlcluster cancel JOB [--purge]
mlcluster controller ...                    the Kubernetes notebook-controller
mlcluster manifests                         YAML a platform team applies
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from typing import Any

from .jobs.model import SpecError
from .jobs.options import add_job_arguments, spec_from_args

# As torchrun: 1 for a job that failed or was interrupted (Ctrl-C, SIGTERM, cancelled).
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_CANCELLED = 1


def _service():
    from .jobs.service import JobService

    return JobService()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mlcluster", description="Distributed jobs from JupyterLab and the shell."
    )
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run a script (or -m module) on N ranks")
    add_job_arguments(run)
    run.add_argument(
        "-m", dest="module", action="store_true", help="run SCRIPT as a module, like python -m"
    )
    run.add_argument("script", help="the Python script (or module with -m)")
    run.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the script")

    jobs = sub.add_parser("jobs", help="list jobs")
    jobs.add_argument("--state", action="append", help="only jobs in this state (repeatable)")
    jobs.add_argument("--backend", help="only jobs of this backend")
    jobs.add_argument(
        "--limit", type=int, default=50, help="at most this many (newest first; default 50)"
    )
    jobs.add_argument("--json", action="store_true", help="print JSON")

    logs = sub.add_parser("logs", help="print a job's logs")
    logs.add_argument("job", help="job id or name")
    logs.add_argument("--rank", type=int, default=None, help="only this rank")
    logs.add_argument(
        "--follow", "-f", action="store_true", help="keep printing until the job ends"
    )

    cancel = sub.add_parser("cancel", help="cancel a job (all ranks)")
    cancel.add_argument("job", help="job id or name")
    cancel.add_argument("--purge", action="store_true", help="also forget the job and its logs")

    pool = sub.add_parser("pool", help="the warm pool of pre-started, CUDA-clean interpreters")
    pool.add_argument("action", choices=["status", "start", "stop"], nargs="?", default="status")

    # Listed for --help; main() hands them to the notebook-controller's own applications.
    sub.add_parser(
        "controller", help="run the notebook-controller (Kubernetes); --help for its options"
    )
    sub.add_parser(
        "manifests", help="print CRDs, RBAC, the controller Deployment, Istio objects as YAML"
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    # The cluster-side commands are traitlets applications with options of their own.
    if argv and argv[0] == "controller":
        from notebook_controller.cli import run_controller

        return run_controller(argv[1:])
    if argv and argv[0] == "manifests":
        from notebook_controller.cli import print_manifests

        return print_manifests(argv[1:])
    args = build_parser().parse_args(argv)
    try:
        return {
            "run": cmd_run,
            "jobs": cmd_jobs,
            "logs": cmd_logs,
            "cancel": cmd_cancel,
            "pool": cmd_pool,
        }[args.command](args)
    except (SpecError, ValueError) as exc:
        print(f"mlcluster: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyError as exc:  # UnknownJob
        print(f"mlcluster: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:  # before there was a job to cancel (a submitted one follows us)
        return EXIT_CANCELLED


# -- run -------------------------------------------------------------------------------


class _Terminated(KeyboardInterrupt):
    """SIGTERM (or SIGHUP) while following a job: handled like Ctrl-C."""


def _raise_terminated(signum, frame) -> None:
    raise _Terminated(signal.Signals(signum).name)


def handle_interrupts() -> None:
    """Ctrl-C, SIGTERM and SIGHUP stop the job and end this command, even when it was started
    with SIGINT ignored (a background job of a non-interactive shell inherits SIG_IGN)."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _raise_terminated)


def cmd_run(args: argparse.Namespace) -> int:
    from .runtime.payload import Payload

    if not args.no_wait:
        handle_interrupts()
    service = _service()
    spec = spec_from_args(args, default_backend=service.config.default_backend)
    if args.module:
        payload = Payload(kind="module", filename=args.script, argv=list(args.args))
    else:
        path = os.path.abspath(args.script)
        if not os.path.isfile(path):
            raise SpecError(f"no such script: {args.script}")
        payload = Payload(kind="script", filename=path, argv=list(args.args))
    if spec.backend == "kubernetes" and not args.module:
        # Pods do not share this filesystem: ship the script's source itself.
        with open(path, encoding="utf-8") as f:
            payload = Payload(kind="code", source=f.read(), argv=list(args.args))
    record = service.submit(
        spec,
        payload,
        origin={"kind": "cli", "command": " ".join(sys.argv[:1] + sys.argv[1:])[:500]},
        attach_to_pid=None if args.no_wait else os.getpid(),
    )
    if args.no_wait:
        print(record.id)
        return 0
    return follow_job(service, record.id, quiet=args.quiet)


def follow_job(service, job_id: str, *, quiet: bool = False) -> int:
    """Stream rank-prefixed output until the job ends; Ctrl-C cancels it."""
    from .jobs.model import JobState

    cursor = None
    try:
        while True:
            record = service.store.get_job(job_id)
            lines, cursor = service.logs(job_id, cursor=cursor)
            if not quiet:
                _print_lines(lines)
            if record.final and not lines:
                break
            if not lines:
                time.sleep(0.05)
                service.reap()
    except KeyboardInterrupt as interrupt:
        # A second signal while cancelling must not leave the job behind: ignore them now.
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, signal.SIG_IGN)
        why = f" ({interrupt})" if isinstance(interrupt, _Terminated) else ""
        print(f"\nmlcluster: cancelling job {job_id}{why} ...", file=sys.stderr)
        service.cancel(job_id)
        return EXIT_CANCELLED
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


def _print_lines(lines: list[dict[str, Any]]) -> None:
    for line in lines:
        stream = sys.stderr if line["stream"] == "stderr" else sys.stdout
        stream.write(f"[rank {line['rank']}] {line['line']}\n")
    sys.stdout.flush()
    sys.stderr.flush()


# -- jobs / logs / cancel -------------------------------------------------------------------


def cmd_jobs(args: argparse.Namespace) -> int:
    import json

    service = _service()
    records, total = service.list(states=args.state, backend=args.backend, limit=args.limit)
    if args.json:
        print(json.dumps([r.to_json() for r in records], indent=2))
        return 0
    print(format_jobs_table(records))
    if total > len(records):
        print(f"({total - len(records)} older jobs not shown; --limit to see more)")
    return 0


def format_jobs_table(records) -> str:
    rows = [("ID", "NAME", "STATE", "RANKS", "BACKEND", "AGE", "INFO")]
    now = time.time()
    for r in records:
        info = r.error or r.reason or ""
        rows.append(
            (
                r.id,
                r.name,
                str(r.state),
                rank_counts(r),
                r.backend,
                format_age(now - r.created),
                info[:60],
            )
        )
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows
    )


def rank_counts(record) -> str:
    """'4/4 running', '3/4 succeeded, 1 failed': how the ranks stand, briefly."""
    counts: dict[str, int] = {}
    for rank in record.ranks:
        counts[str(rank.state)] = counts.get(str(rank.state), 0) + 1
    if not counts:
        return "0"
    ordered = sorted(counts.items(), key=lambda kv: -kv[1])
    head, *rest = ordered
    text = f"{head[1]}/{record.spec.workers} {head[0]}"
    return ", ".join([text, *(f"{n} {state}" for state, n in rest)])


def format_age(seconds: float) -> str:
    seconds = max(0, int(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m"
    if seconds < 86400:
        return f"{seconds // 3600}h"
    return f"{seconds // 86400}d"


def cmd_logs(args: argparse.Namespace) -> int:
    service = _service()
    job = service.get(args.job)
    if args.follow:
        try:
            for line in service.follow_logs(job.id, args.rank):
                _print_lines([line])
        except KeyboardInterrupt:
            return 0
        return 0
    cursor = None
    while True:
        lines, cursor = service.logs(job.id, args.rank, cursor)
        if not lines:
            return 0
        _print_lines(lines)


def cmd_cancel(args: argparse.Namespace) -> int:
    service = _service()
    job = service.get(args.job)
    record = service.cancel(job.id, purge=args.purge)
    if record is None:
        print(f"{job.id} purged")
    else:
        print(f"{record.id} {record.state}")
    return 0


def cmd_pool(args: argparse.Namespace) -> int:
    from .backends.local import warmpool
    from .config import get_config

    config = get_config()
    if args.action == "start":
        if warmpool.ensure_zygote(config) is None:
            print(
                "mlcluster: the warm pool did not come up (see its log in the pool directory)",
                file=sys.stderr,
            )
            return EXIT_FAILED
    elif args.action == "stop":
        print("stopped" if warmpool.stop(config) else "no warm pool is running")
        return 0
    status = warmpool.status(config)
    if status is None:
        print(
            f"no warm pool is running (enabled: {config.warm_pool}; it starts with the first job)"
        )
        return 0
    mib = 1024 * 1024
    uss = (
        f", {status['uss_bytes'] / mib:.0f} MiB of its own (USS)" if status.get("uss_bytes") else ""
    )
    print(
        f"warm pool pid {status['pid']}: modules {', '.join(status['modules']) or '-'}; "
        f"memory {status['rss_bytes'] / mib:.0f} MiB RSS{uss}; CUDA initialised: {status['cuda_initialized']}; "
        f"up {status['uptime']:.0f}s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
