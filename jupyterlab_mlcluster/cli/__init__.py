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

Each group of commands is a module of Command objects beside this one; what the CLI and the
kernel both print is presentation.py; the job options are jobs/options.py.
"""

from __future__ import annotations

from .. import backends  # noqa: F401 - a front end fills the backend registry
from ..presentation import format_jobs_table
from . import job_commands, schedule_commands, session_commands
from .command_line import Command, CommandLine
from .run_command import RUN

__all__ = ["COMMANDS", "Command", "CommandLine", "format_jobs_table", "main"]


def _controller(argv: list[str]) -> int:
    from notebook_controller.cli import run_controller

    return run_controller(argv)


def _manifests(argv: list[str]) -> int:
    from notebook_controller.cli import print_manifests

    return print_manifests(argv)


COMMANDS = (
    RUN,
    *schedule_commands.COMMANDS,
    *job_commands.COMMANDS,
    *session_commands.COMMANDS,
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
