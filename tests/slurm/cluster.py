"""A real one-node Slurm for tests and benches: munged, slurmctld and slurmd as root.

Everything it writes (munge key and socket, slurm.conf, state, spool, logs, pid files) is
in one temporary directory, its ports are free ones of this run, and it is stopped by the
pids it started. Debian's slurm-wlm (22.05) and munge: `apt-get install slurm-wlm munge`
(scripts/test.sh does it on a fresh machine). The node is this machine's short hostname
with CPUs=2, so a 2-rank job fills it and the next one must wait.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

from tests.helpers import free_port

# The node's epilog: an allocation stays COMPLETING while a test holds endings (bounded: a
# test that never lets go delays an ending by 30 s, no more).
EPILOG = """#!/bin/sh
i=0
while [ -e {hold} ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i + 1)); done
exit 0
"""

DAEMONS = ("munged", "slurmctld", "slurmd", "sinfo", "sbatch", "srun", "squeue", "scancel")
NODE_CPUS = 2


def missing() -> str | None:
    """Why no Slurm can run here (None: it can)."""
    if os.geteuid() != 0:
        return "the test Slurm runs its daemons as root"
    absent = [
        d for d in DAEMONS if not shutil.which(d, path=os.environ.get("PATH", "") + ":/usr/sbin")
    ]
    if absent:
        return f"not installed: {', '.join(absent)} (apt-get install slurm-wlm munge)"
    return None


def _which(name: str) -> str:
    return shutil.which(name, path=os.environ.get("PATH", "") + ":/usr/sbin:/usr/bin")


class SlurmCluster:
    def __init__(self, root: Path):
        self.root = Path(root)
        self.node = socket.gethostname().split(".")[0]
        self.conf = self.root / "slurm.conf"
        self.processes: list[tuple[str, subprocess.Popen]] = []

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def start(self, timeout: float = 60.0) -> None:
        r = self.root
        for sub in ("munge", "munge-run", "state", "spool", "log", "run"):
            (r / sub).mkdir(parents=True, exist_ok=True)
        (r / "munge").chmod(0o700)
        (r / "munge-run").chmod(0o755)  # clients must reach the socket
        key = r / "munge" / "munge.key"
        subprocess.run([_which("mungekey"), "--create", f"--keyfile={key}"], check=True)
        key.chmod(0o400)
        socket_path = r / "munge-run" / "munge.socket"
        self._spawn(
            "munged",
            [
                _which("munged"),
                "--foreground",
                "--force",
                f"--socket={socket_path}",
                f"--key-file={key}",
                f"--pid-file={r / 'munge' / 'munged.pid'}",
                f"--seed-file={r / 'munge' / 'munged.seed'}",
                f"--log-file={r / 'log' / 'munged.log'}",
            ],
        )
        self._wait(lambda: socket_path.exists(), timeout, "munged's socket")
        epilog = r / "epilog.sh"
        epilog.write_text(EPILOG.format(hold=self.hold_file))
        epilog.chmod(0o755)
        self.conf.write_text(self.config(socket_path, free_port(), free_port()))
        self._spawn("slurmctld", [_which("slurmctld"), "-D", "-f", str(self.conf)])
        self._spawn("slurmd", [_which("slurmd"), "-D", "-f", str(self.conf)])
        self._wait(self.idle, timeout, f"sinfo to show node {self.node} idle")

    def config(self, munge_socket: Path, ctld_port: int, slurmd_port: int) -> str:
        r = self.root
        return "\n".join(
            [
                "ClusterName=mlcluster-test",
                f"SlurmctldHost={self.node}(127.0.0.1)",
                f"SlurmctldPort={ctld_port}",
                f"SlurmdPort={slurmd_port}",
                "SlurmUser=root",
                "SlurmdUser=root",
                "AuthType=auth/munge",
                "CredType=cred/munge",
                f"AuthInfo=socket={munge_socket}",
                f"StateSaveLocation={r / 'state'}",
                f"SlurmdSpoolDir={r / 'spool'}",
                f"SlurmctldPidFile={r / 'run' / 'slurmctld.pid'}",
                f"SlurmdPidFile={r / 'run' / 'slurmd.pid'}",
                f"SlurmctldLogFile={r / 'log' / 'slurmctld.log'}",
                f"SlurmdLogFile={r / 'log' / 'slurmd.log'}",
                "SelectType=select/cons_tres",
                "SelectTypeParameters=CR_Core_Memory",
                "ProctrackType=proctrack/linuxproc",
                "TaskPlugin=task/none",
                "SchedulerType=sched/backfill",
                # Look at the queue every second (the default waits for events or 60 s).
                "SchedulerParameters=sched_interval=1,bf_interval=1",
                "MpiDefault=none",
                "ReturnToService=2",
                # Slurm's own SIGTERM -> SIGKILL wait (ours is kill_grace_period).
                "KillWait=2",
                "MinJobAge=30",
                f"Epilog={r / 'epilog.sh'}",
                "InactiveLimit=0",
                "JobAcctGatherType=jobacct_gather/none",
                "AccountingStorageType=accounting_storage/none",
                "PriorityType=priority/basic",
                "DefMemPerCPU=100",
                f"NodeName={self.node} NodeAddr=127.0.0.1 CPUs={NODE_CPUS} RealMemory=1000 State=UNKNOWN",
                # A job in `urgent` preempts (cancels) what runs in `debug`.
                "PreemptType=preempt/partition_prio",
                "PreemptMode=CANCEL",
                "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP PriorityTier=1",
                "PartitionName=urgent Nodes=ALL MaxTime=INFINITE State=UP PriorityTier=10",
                "",
            ]
        )

    @property
    def hold_file(self) -> Path:
        return self.root / "hold-endings"

    @contextlib.contextmanager
    def ending_held(self) -> Iterator[None]:
        """Every allocation that ends meanwhile stays COMPLETING (its epilog waits) until the
        block is left: what a slow step teardown or epilog does, made certain for a test."""
        self.hold_file.touch()
        try:
            yield
        finally:
            self.hold_file.unlink(missing_ok=True)

    def _spawn(self, name: str, argv: list[str]) -> None:
        out = open(self.root / "log" / f"{name}.out", "ab")  # the daemon's life
        proc = subprocess.Popen(
            argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=self.env,
            start_new_session=True,
        )
        out.close()
        self.processes.append((name, proc))

    def _wait(self, predicate, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            for name, proc in self.processes:
                if proc.poll() is not None:
                    raise RuntimeError(f"{name} exited ({proc.returncode}): {self.logs()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"timed out waiting for {what}: {self.logs()}")
            time.sleep(0.2)

    def idle(self) -> bool:
        done = self.run("sinfo", "--noheader", "--Node", "--format=%N %t", check=False)
        return done.returncode == 0 and f"{self.node} idle" in done.stdout

    def run(self, command: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run(
            [_which(command), *args],
            capture_output=True,
            text=True,
            env=self.env,
            timeout=30,
            check=check,
        )

    def jobs(self) -> list[str]:
        """Every job Slurm still queues or runs: '<id> <state> <name>'."""
        out = self.run("squeue", "--noheader", "--format=%i %T %j").stdout
        return [line.strip() for line in out.splitlines() if line.strip()]

    def wait_empty(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while self.jobs():
            if time.monotonic() > deadline:
                raise AssertionError(f"left in squeue: {self.jobs()}")
            time.sleep(0.2)

    def pid(self, name: str) -> int:
        """The pid of one of the daemons this cluster started."""
        return next(proc.pid for n, proc in self.processes if n == name)

    def logs(self) -> str:
        parts = []
        for path in sorted((self.root / "log").glob("*")):
            text = path.read_text(errors="replace")[-2000:]
            parts.append(f"--- {path.name}\n{text}")
        return "\n".join(parts)

    def stop(self) -> None:
        """Cancel what is left, then stop the daemons by pid: slurmd, slurmctld, munged."""
        if any(proc.poll() is None for name, proc in self.processes if name == "slurmctld"):
            self.run("scancel", "--user=root", check=False)
        for _name, proc in reversed(self.processes):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        self.processes.clear()
