"""The Slurm backend's only outside calls: sbatch, squeue, sacct, scancel, sinfo as
subprocesses.

Every call has a timeout (`MLClusterConfig.slurm_command_timeout`); a call that fails the
way a busy or restarting controller fails (a timeout, "Socket timed out", "Unable to contact
slurm controller") is retried after the package's one backoff (`jobs/backoff.py`, jittered)
at most MAX_TRIES times; anything else (Slurm refusing the request) raises `SlurmError` with
Slurm's own words at once. Blocking: callers run them in the supervisor process, or in a
server's executor, never on tornado's loop.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import time
from collections.abc import Sequence

from ...jobs.backoff import Backoff
from . import script

log = logging.getLogger("jupyterlab_mlcluster.slurm")

MAX_TRIES = 4
RETRY = Backoff(first=0.5, cap=8.0, floor=0.5)
# What Slurm's clients print when the controller is busy, restarting or unreachable: worth
# another try. Anything else is an answer.
_TRANSIENT = (
    "socket timed out",
    "unable to contact slurm controller",
    "slurm_receive_msg",
    "connection refused",
    "temporarily unavailable",
    "try again",
    "zero bytes were transmitted",
    "communication connection failure",
)


class SlurmError(RuntimeError):
    """A Slurm command refused or failed; the message is Slurm's own."""

    def __init__(self, message: str, *, transient: bool = False):
        super().__init__(message)
        self.transient = transient


class SlurmCommands:
    def __init__(self, bin_dir: str = "", timeout: float = 30.0, env: dict[str, str] | None = None):
        self.bin_dir = bin_dir
        self.timeout = timeout
        self.env = env

    def path(self, command: str) -> str:
        """The command's path, or SlurmError saying where it was looked for."""
        if self.bin_dir:
            path = os.path.join(self.bin_dir, command)
            if os.access(path, os.X_OK):
                return path
            raise SlurmError(
                f"{command} not found in {self.bin_dir} (MLClusterConfig.slurm_bin_dir): the "
                "notebook must be able to run Slurm's commands to use the slurm backend"
            )
        found = shutil.which(command, path=(self.env or os.environ).get("PATH"))
        if not found:
            raise SlurmError(
                f"{command} not found on PATH: the slurm backend needs Slurm's commands where "
                "the notebook runs (a login node; or set MLClusterConfig.slurm_bin_dir)"
            )
        return found

    def run(
        self,
        command: str,
        args: Sequence[str],
        *,
        input: str | None = None,
        env: dict[str, str] | None = None,
        tries: int = MAX_TRIES,
        ok_codes: tuple[int, ...] = (0,),
    ) -> subprocess.CompletedProcess:
        """Run a Slurm command; retry what looks transient (jittered backoff, capped)."""
        argv = [self.path(command), *args]
        attempt = 0
        while True:
            try:
                done = subprocess.run(
                    argv,
                    check=False,
                    input=input,
                    capture_output=True,
                    text=True,
                    timeout=self.timeout,
                    env=env if env is not None else self.env,
                )
                if done.returncode in ok_codes:
                    return done
                message = (
                    script.slurm_error(done.stderr) or f"{command} exited with {done.returncode}"
                )
                transient = any(t in message.lower() for t in _TRANSIENT)
                error = SlurmError(message, transient=transient)
            except subprocess.TimeoutExpired:
                error = SlurmError(
                    f"{command} did not answer within {self.timeout:g} s", transient=True
                )
            except OSError as exc:
                raise SlurmError(f"cannot run {command}: {exc}") from None
            attempt += 1
            if not error.transient or attempt >= tries:
                raise error
            delay = RETRY.delay(attempt - 1)
            log.warning(
                "%s failed (%s); retry %d of %d in %.1f s",
                command,
                error,
                attempt,
                tries - 1,
                delay,
            )
            time.sleep(delay)

    # -- the calls the backend makes -------------------------------------------------------

    def test_only(self, args: list[str], env: dict[str, str] | None = None) -> None:
        """`sbatch --test-only`: would Slurm take this job? SlurmError (its words) if not."""
        self.run(
            "sbatch",
            ["--test-only", *[a for a in args if a != "--parsable"], "--wrap=true"],
            env=env,
        )

    def submit(self, args: list[str], script_path: str, env: dict[str, str]) -> str:
        """sbatch; the Slurm job id. Not retried: a submission whose answer was lost may have
        made a job (the reaper finds it by its comment); the caller decides."""
        done = self.run("sbatch", [*args, script_path], env=env, tries=1)
        job_id = done.stdout.strip().split(";")[0]
        if not job_id.isdigit():
            raise SlurmError(f"sbatch answered {done.stdout.strip()!r}, not a job id")
        return job_id

    def jobs(self, *, job_ids: Sequence[str] = (), user: str | None = None) -> list[dict[str, str]]:
        """squeue rows (any state Slurm still remembers) of these jobs, or of `user`'s."""
        args = ["--noheader", "--states=all", f"--format={script.SQUEUE_FORMAT}"]
        if job_ids:
            args.append("--jobs=" + ",".join(job_ids))
        if user:
            args.append(f"--user={user}")
        # squeue exits 1 for a job id it no longer knows: that is "none", not a failure.
        done = self.run("squeue", args, ok_codes=(0, 1))
        if done.returncode == 1:
            if "invalid job id" in done.stderr.lower():
                return []
            raise SlurmError(script.slurm_error(done.stderr))
        return script.parse_jobs(done.stdout)

    def queue(self, *, user: str | None, by_priority: bool) -> list[dict[str, str]]:
        """The watcher's one squeue call (watch.py): every job Slurm remembers of `user`, or
        of every user (None); `by_priority`: in Slurm's queue order, highest first."""
        args = ["--noheader", "--states=all", f"--format={script.WATCH_FORMAT}"]
        if user:
            args.append(f"--user={user}")
        if by_priority:
            args.append("--sort=-p,i")
        return script.parse_jobs(self.run("squeue", args).stdout, script.WATCH_FIELDS)

    def accounting(self, job_ids: Sequence[str]) -> list[dict[str, str]]:
        """sacct's rows of jobs squeue no longer shows (their allocations, not steps)."""
        args = ["--noheader", "--parsable2", "--allocations", f"--format={script.SACCT_FORMAT}"]
        args.append("--jobs=" + ",".join(job_ids))
        return script.parse_accounting(self.run("sacct", args).stdout)

    def signal(self, job_id: str, signal_name: str, *, full: bool = False) -> None:
        args = [f"--signal={signal_name}", job_id]
        if full:
            args.insert(0, "--full")
        self.run("scancel", args)

    def cancel(self, job_ids: Sequence[str]) -> None:
        if job_ids:
            self.run("scancel", list(job_ids))

    def sinfo(self) -> str:
        return self.run("sinfo", ["--noheader", "--Node", f"--Format={script.SINFO_FORMAT}"]).stdout
