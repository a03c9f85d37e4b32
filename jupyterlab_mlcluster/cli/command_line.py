"""`mlcluster`'s command line: a Command (its `--help` line, its arguments or subcommands of
its own, what runs it) and the CommandLine that parses only the command asked for and runs
it, with the errors a user can act on said in a line."""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..jobs.model import SpecError
from ..jobs.options import add_arguments

# As torchrun: 1 for a job that failed or was interrupted (Ctrl-C, SIGTERM, cancelled).
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_CANCELLED = 1

# A command's arguments: (flags, add_argument's keywords) each.
Arguments = Sequence[tuple[tuple[str, ...], dict[str, Any]]]


def arg(*flags: str, **keywords: Any) -> tuple[tuple[str, ...], dict[str, Any]]:
    """One argument of a command, as `add_argument(*flags, **keywords)` adds it."""
    return flags, keywords


JSON = arg("--json", action="store_true", help="print JSON")


def job_service():
    """The engine's one API (made when a command runs, not when the program starts)."""
    from ..jobs.service import JobService

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
        from ..jobs.storage.store import UnsafeStore

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
            from ..config import get_config
            from ..jobs.storage.fsinfo import is_storage_full, no_space_text

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
