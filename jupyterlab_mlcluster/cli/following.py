"""Following a job (or a sweep) from the terminal to its end: its lines printed as they come,
and Ctrl-C, SIGTERM, SIGHUP or SIGQUIT cancelling what this command started."""

from __future__ import annotations

import os
import signal
import sys
import time
from typing import Any

from ..jobs.log_text import LogText
from ..jobs.model import JobState
from .command_line import EXIT_CANCELLED, EXIT_FAILED

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


def _ignore_interrupts() -> None:
    """A second signal while cancelling must not leave the job behind."""
    for signum in (signal.SIGINT, *_TERMINATING):
        signal.signal(signum, signal.SIG_IGN)


class LinePrinter:
    """A job's log lines on this terminal, each as the log view writes it (rank prefixes,
    notices), on stdout or stderr as the rank wrote it."""

    def __init__(self) -> None:
        self.view = LogText()

    def print(self, lines: list[dict[str, Any]]) -> None:
        """Each line in the log's order, also when stdout and stderr share one file (`> out
        2>&1`): a stream is flushed before the other is written (a block-buffered stdout came
        out in lumps after the stderr lines written since)."""
        last = None
        for line, text in self.view.lines(lines):
            stream = sys.stderr if line["stream"] == "stderr" else sys.stdout
            if last is not None and stream is not last:
                last.flush()
            stream.write(f"{text}\n")
            last = stream
        sys.stdout.flush()
        sys.stderr.flush()


class FollowedJob:
    """One job followed to its end: rank-prefixed output as it comes; Ctrl-C (or a
    terminating signal) cancels it and prints what its ranks print while they stop."""

    def __init__(self, service, job_id: str, *, quiet: bool = False):
        self.service = service
        self.job_id = job_id
        self.quiet = quiet
        self.printer = LinePrinter()

    def run(self) -> int:
        """The command's exit status: 0 if the job succeeded, 1 if it failed or was
        cancelled."""
        from ..jobs.follow import JobFollower

        job_id, service = self.job_id, self.service
        follower = JobFollower(service.store, job_id, reap=service.reap)
        try:
            for step in follower.steps():
                if not self.quiet:
                    self.printer.print(step.lines)
        except KeyboardInterrupt as interrupt:
            _ignore_interrupts()
            why = f" ({interrupt})" if isinstance(interrupt, _Terminated) else ""
            print(f"\nmlcluster: cancelling job {job_id}{why} ...", file=sys.stderr)
            by = (
                f"{interrupt} to mlcluster run (pid {os.getpid()})"
                if isinstance(interrupt, _Terminated)
                else "user (Ctrl-C of mlcluster run)"
            )
            return self._cancel(follower.cursor, by=by)
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

    def _cancel(self, cursor, *, by: str) -> int:
        """Cancel the job, printing what its ranks print while they stop (a SIGTERM handler
        saving a checkpoint says so), until it is final; then why it ended."""
        from ..jobs.follow import JobFollower

        job_id, service = self.job_id, self.service
        service.cancel(job_id, wait=False, by=by)
        deadline = time.monotonic() + service.job_grace(job_id) + 10.0
        follower = JobFollower(service.store, job_id, cursor=cursor, reap=service.reap)
        for step in follower.steps():
            if not self.quiet:
                self.printer.print(step.lines)
            if time.monotonic() > deadline:  # a wedged supervisor: the waiting cancel kills it
                service.cancel(job_id, by=by)
                follower.changed_here()
                deadline = float("inf")
        record = step.record
        print(f"mlcluster: job {job_id} {record.reason or record.state}", file=sys.stderr)
        return EXIT_CANCELLED


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
        _ignore_interrupts()
        print(f"\nmlcluster: cancelling sweep {handle.id} ...", file=sys.stderr)
        handle.cancel()
        return EXIT_CANCELLED
    print(repr(handle))
    return 0 if all(t.state == "succeeded" for t in handle.trials) else EXIT_FAILED
