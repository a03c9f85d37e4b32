"""`mlcluster run`: a script (or -m module) on N ranks, or one job per trial of a sweep,
followed to its end in this terminal."""

from __future__ import annotations

import argparse
import os
import sys

from ..jobs.model import SpecError
from ..jobs.options import (
    JOB_ARGUMENTS,
    SWEEP_ARGUMENTS,
    grace_from_args,
    spec_from_args,
    sweep_from_args,
)
from .command_line import Command, arg, job_service
from .following import FollowedJob, follow_sweep, handle_interrupts

# The script a job runs and its arguments (`run`, `schedule add`).
SCRIPT = (
    arg("-m", dest="module", action="store_true", help="run SCRIPT as a module, like python -m"),
    arg("script", help="the Python script (or module with -m)"),
    arg("args", nargs=argparse.REMAINDER, help="arguments for the script"),
)


def cmd_run(args: argparse.Namespace) -> int:
    if not args.no_wait:
        handle_interrupts()
    service = job_service()
    spec = spec_from_args(args, default_backend=service.config.default_backend)
    grace = grace_from_args(args)
    sweep = sweep_from_args(args)
    payload = script_payload(args, spec)
    origin = {"kind": "cli", "command": " ".join(sys.argv[:1] + sys.argv[1:])[:500]}
    attach = None if args.no_wait else os.getpid()
    preload = _script_preload(service.config, payload)
    if sweep is not None:
        from ..jobs.experiments.sweep import submit_sweep

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
    return FollowedJob(service, record.id, quiet=args.quiet).run()


def _script_preload(config, payload) -> list[str]:
    """What the warm pool may learn from the script: its top imports (read, never run)."""
    if not (config.warm_pool and config.warm_pool_learn):
        return []
    from ..jobs.warm import preload

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
    from ..runtime.payload import Payload

    if args.module:
        return Payload(kind="module", filename=args.script, argv=list(args.args))
    path = os.path.abspath(args.script)
    if not os.path.isfile(path):
        raise SpecError(f"no such script: {args.script}")
    if spec.backend == "kubernetes":
        with open(path, encoding="utf-8") as f:
            return Payload(kind="code", source=f.read(), argv=list(args.args))
    return Payload(kind="script", filename=path, argv=list(args.args))


RUN = Command(
    "run",
    "run a script (or -m module) on N ranks",
    cmd_run,
    (*JOB_ARGUMENTS, *SWEEP_ARGUMENTS, *SCRIPT),
)
