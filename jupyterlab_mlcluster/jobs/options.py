"""The job options shared by `%%distributed` and `mlcluster run` (one argparse definition)."""

from __future__ import annotations

import argparse
from typing import Any

from .model import JobSpec


def add_job_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--workers", "-n", type=str, default=None, help="number of ranks (default 1)")
    add("--gpus-per-worker", type=str, default=None, help="GPUs each rank owns (default 0)")
    add("--cpus", type=str, default=None, help="CPU slots (local) or cores (Kubernetes) per rank (default 1)")
    add("--memory", type=str, default=None, help="memory per rank, e.g. 4Gi, 512M")
    add("--framework", type=str, default=None, help="pytorch (default), tensorflow, jax or none")
    add("--backend", type=str, default=None, help="local (default) or kubernetes")
    add("--image", type=str, default=None, help="container image (kubernetes)")
    add("--name", type=str, default=None, help="a name for the job")
    add("--env", type=str, action="append", default=None, metavar="KEY=VALUE", help="extra environment (repeatable)")
    add("--timeout", type=str, default=None, help="fail the job after this long, e.g. 30m, 1h30m")
    add("--max-restarts", type=str, default=None, help="restart all ranks up to R times after a failure")
    add("--queue", type=str, default=None, help="scheduler queue (Volcano/Kueue on kubernetes)")
    add("--priority", type=str, default=None, help="higher runs first (default 0)")
    add("--no-wait", action="store_true", default=False, help="return at once with the job id")
    add("--quiet", "-q", action="store_true", default=False, help="no live output")


def spec_options(args: argparse.Namespace) -> dict[str, Any]:
    """The JobSpec fields the user set on the command line (the rest keep defaults)."""
    names = {
        "workers": args.workers,
        "gpus_per_worker": args.gpus_per_worker,
        "cpus": args.cpus,
        "memory": args.memory,
        "framework": args.framework,
        "backend": args.backend,
        "image": args.image,
        "name": args.name,
        "env": args.env,
        "timeout": args.timeout,
        "max_restarts": args.max_restarts,
        "queue": args.queue,
        "priority": args.priority,
    }
    return {k: v for k, v in names.items() if v is not None}


def spec_from_args(args: argparse.Namespace, default_backend: str = "local") -> JobSpec:
    return JobSpec.from_options(spec_options(args), default_backend=default_backend)
