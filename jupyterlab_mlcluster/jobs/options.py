"""The job options shared by `%%distributed` and `mlcluster run` (one argparse definition)."""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from .model import JobSpec, parse_duration

if TYPE_CHECKING:
    from .experiments.sweeps import SweepSpec

# One add_argument call as data: (flags, keyword arguments).
Argument = tuple[tuple[str, ...], dict[str, Any]]

# (flags, argparse keyword arguments): the one definition of the job options.
JOB_ARGUMENTS: list[Argument] = [
    (("--workers", "-n"), {"default": None, "help": "number of ranks (default 1)"}),
    (("--gpus-per-worker",), {"default": None, "help": "GPUs each rank owns (default 0)"}),
    (
        ("--cpus",),
        {
            "default": None,
            "help": "CPU slots (local), cores (Kubernetes) or CPUs (Slurm) per rank (default 1)",
        },
    ),
    (("--memory",), {"default": None, "help": "memory per rank, e.g. 4Gi, 512M"}),
    (("--framework",), {"default": None, "help": "pytorch (default), tensorflow, jax or none"}),
    (("--backend",), {"default": None, "help": "local (default), kubernetes or slurm"}),
    (("--image",), {"default": None, "help": "container image (kubernetes)"}),
    (("--name",), {"default": None, "help": "a name for the job"}),
    (
        ("--env",),
        {
            "action": "append",
            "default": None,
            "metavar": "KEY=VALUE",
            "help": "extra environment (repeatable)",
        },
    ),
    (("--timeout",), {"default": None, "help": "fail the job after this long, e.g. 30m, 1h30m"}),
    (
        ("--max-restarts",),
        {"default": None, "help": "restart all ranks up to R times after a failure"},
    ),
    (
        ("--queue",),
        {
            "default": None,
            "help": "scheduler queue (Volcano/Kueue on kubernetes), partition (slurm)",
        },
    ),
    (
        ("--grace",),
        {
            "default": None,
            "metavar": "DURATION",
            "help": "local ranks' time between SIGTERM and SIGKILL when the job is stopped, "
            "e.g. 30s, 2m (default MLClusterConfig.kill_grace_period: 30 s, as torchrun)",
        },
    ),
    (("--priority",), {"default": None, "help": "higher runs first (default 0)"}),
    (
        ("--stall-after",),
        {
            "default": None,
            "metavar": "DURATION",
            "help": "flag the job stalled when a rank has printed nothing, reported no progress "
            "and used no CPU this long, e.g. 10m; 0: never (default MLClusterConfig.stall_after: "
            "5m; local backend)",
        },
    ),
    (
        ("--on-stall",),
        {
            "default": None,
            "choices": ["warn", "cancel"],
            "help": "warn (default: flag it, with where the ranks are) or cancel the job",
        },
    ),
    (
        ("--tensorboard",),
        {
            "default": None,
            "metavar": "DIR",
            "help": "the ranks' $MLCLUSTER_TENSORBOARD_DIR: an absolute path or a URI such as "
            "s3://bucket/runs/{job} (default MLClusterConfig.tensorboard_dir)",
        },
    ),
    (
        ("--track",),
        {
            "default": None,
            "choices": ["none", "mlflow"],
            "help": "record the job as an MLflow run at MLClusterConfig.mlflow_tracking_uri "
            "(default: MLflow's local store, ./mlflow.db) (default MLClusterConfig.track: none)",
        },
    ),
    (
        ("--no-sync-packages",),
        {
            "dest": "sync_packages",
            "action": "store_false",
            "default": None,
            "help": "Kubernetes: do not install in the job's pods the packages installed in "
            "the notebook since its pod started",
        },
    ),
    (
        ("--no-wait",),
        {"action": "store_true", "default": False, "help": "return at once with a job handle"},
    ),
    (
        ("--quiet", "-q"),
        {"action": "store_true", "default": False, "help": "no live monitor or output"},
    ),
]


# A cell's session (jobs/sessions.py): `%%distributed` only, for now (a CLI script is one
# run, not cells).
SESSION_ARGUMENTS: list[Argument] = [
    (
        ("--session",),
        {
            "default": None,
            "metavar": "NAME",
            "help": "run the cell in your session NAME: live ranks that keep their globals "
            "from cell to cell (started with this cell's options when there is none)",
        },
    ),
]


def add_job_arguments(parser: argparse.ArgumentParser) -> None:
    for flags, kwargs in JOB_ARGUMENTS:
        parser.add_argument(*flags, **kwargs)


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
        "tensorboard": args.tensorboard,
        "sync_packages": getattr(args, "sync_packages", None),
        "stall_after": getattr(args, "stall_after", None),
        "on_stall": getattr(args, "on_stall", None),
        "track": getattr(args, "track", None),
    }
    return {k: v for k, v in names.items() if v is not None}


def spec_from_args(args: argparse.Namespace, default_backend: str = "local") -> JobSpec:
    return JobSpec.from_options(spec_options(args), default_backend=default_backend)


def grace_from_args(args: argparse.Namespace) -> float | None:
    """--grace in seconds (None: the setting's); SpecError for anything but a duration."""
    return parse_duration(getattr(args, "grace", None), option="grace")


# The sweep options (`%%distributed` and `mlcluster run`); see jobs/experiments/sweeps.py.
SWEEP_ARGUMENTS: list[Argument] = [
    (
        ("--sweep",),
        {
            "action": "append",
            "default": None,
            "metavar": "NAME=V1,V2|uniform(a,b)|loguniform(a,b)|choice(...)",
            "help": "run one job per value (grid), or draw values with --trials (repeatable)",
        },
    ),
    (("--trials",), {"default": None, "help": "random search: this many draws"}),
    (("--parallel",), {"default": None, "help": "at most K trials running at once"}),
    (("--metric",), {"default": None, "help": "the key of rank 0's value that scores a trial"}),
    (("--mode",), {"default": None, "help": "min (default) or max: which score is best"}),
    (("--seed",), {"default": None, "help": "seed of the random search (reproducible draws)"}),
]

# The schedule policies (`%%distributed --schedule` and `mlcluster schedule add`).
SCHEDULE_ARGUMENTS: list[Argument] = [
    (
        ("--timezone",),
        {"default": None, "help": "time zone of the cron expression (default UTC)"},
    ),
    (
        ("--concurrency",),
        {"default": None, "help": "Allow (default), Forbid or Replace a run still active"},
    ),
    (
        ("--starting-deadline",),
        {"default": None, "help": "skip a tick missed by more than this, e.g. 10m"},
    ),
    (
        ("--successful-history",),
        {"default": None, "help": "keep this many succeeded runs (default 3)"},
    ),
    (("--failed-history",), {"default": None, "help": "keep this many failed runs (default 1)"}),
    (("--schedule-name",), {"default": None, "help": "the schedule's name (default --name)"}),
]


def schedule_options_from_args(args: argparse.Namespace, spec: JobSpec) -> dict[str, Any]:
    """The schedule settings of --schedule/--timezone/... (name: --schedule-name, else --name)."""
    from .experiments.schedules import ScheduleError

    name = args.schedule_name or spec.name
    if not name:
        raise ScheduleError("a schedule needs a name: add --name NAME (its runs are NAME-<time>)")
    return {
        "name": name,
        "cron": args.schedule if getattr(args, "schedule", None) is not None else args.cron,
        "timezone": args.timezone,
        "concurrency": args.concurrency,
        "starting_deadline": args.starting_deadline,
        "successful_history": args.successful_history,
        "failed_history": args.failed_history,
    }


def add_arguments(parser: argparse.ArgumentParser, arguments: Iterable[Argument]) -> None:
    for flags, kwargs in arguments:
        parser.add_argument(*flags, **kwargs)


def sweep_from_args(args: argparse.Namespace) -> SweepSpec | None:
    """The SweepSpec of --sweep/--trials/..., or None (SweepError if inconsistent)."""
    from .experiments.sweeps import parse_sweep

    return parse_sweep(
        args.sweep,
        trials=args.trials,
        parallel=args.parallel,
        metric=args.metric,
        mode=args.mode,
        seed=args.seed,
    )
