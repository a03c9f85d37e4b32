"""Rank processes on this machine: their environment, and starting/stopping them.

Two ways to start a rank, same result (own session and process group, stdio on pipes, a
report pipe, death with the supervisor):
- cold: a fresh `python -m jupyterlab_mlcluster.runtime.worker` (fork + exec);
- warm: a fork of the supervisor, when the supervisor itself is a child of the warm pool's
  CUDA-clean zygote (so torch is already imported; see jobs/warm/).
"""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from ...jobs.model import JobSpec
from ...jobs.running.proctree import our_group
from ...runtime.ports import reserve_port

_LOOPBACK = "127.0.0.1"


def job_ports(spec: JobSpec) -> dict[str, Any]:
    """Fresh ports for one attempt of a job (a restart gets new ones), held for its ranks
    (runtime/ports.py: why not merely free ones)."""
    ports: dict[str, Any] = {"master": reserve_port()}
    if spec.framework == "tensorflow":
        ports["tf"] = [reserve_port() for _ in range(spec.workers)]
    if spec.framework == "jax":
        ports["jax"] = reserve_port()
    return ports


def rank_environment(
    base: dict[str, str],
    spec: JobSpec,
    rank: int,
    gpus: list[int],
    ports: dict[str, Any],
    *,
    job_id: str,
    restart: int = 0,
    host: str = "localhost",
    error_file: str | None = None,
    pool_has_gpus: bool = True,
) -> dict[str, str]:
    """The torchrun-compatible environment of one local rank (pure).

    The same variables, with the same values, as `torchrun --standalone --nproc-per-node N`
    gives its workers (torch.distributed.elastic's local agent); README "Rank environment"."""
    env = dict(base)
    env.update(spec.env)
    env.update(
        {
            "RANK": str(rank),
            "WORLD_SIZE": str(spec.workers),
            "LOCAL_RANK": str(rank),
            "LOCAL_WORLD_SIZE": str(spec.workers),
            "GROUP_RANK": "0",
            "GROUP_WORLD_SIZE": "1",
            "ROLE_NAME": "default",
            "ROLE_RANK": str(rank),
            "ROLE_WORLD_SIZE": str(spec.workers),
            "MASTER_ADDR": host,
            "MASTER_PORT": str(ports["master"]),
            "TORCHELASTIC_RESTART_COUNT": str(restart),
            "TORCHELASTIC_MAX_RESTARTS": str(spec.max_restarts),
            "TORCHELASTIC_RUN_ID": job_id,
            # Rank 0 hosts the TCPStore at MASTER_PORT (there is no agent store).
            "TORCHELASTIC_USE_AGENT_STORE": "False",
            "PYTHONUNBUFFERED": "1",
            "MLCLUSTER_JOB_ID": job_id,
        }
    )
    env.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")  # torchrun's default; the user's wins
    if error_file:
        # `@record` (torch.distributed.elastic) writes a failure here; the job's error reads it.
        env["TORCHELASTIC_ERROR_FILE"] = error_file
    if pool_has_gpus:
        # NVML numbers GPUs in PCI order; make CUDA agree so the metrics match the ranks.
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in gpus)
    # Like torchrun: one thread per slot unless the user says otherwise, so N ranks do not
    # fight over the cores with N x cores OpenMP threads.
    if "OMP_NUM_THREADS" not in spec.env and "OMP_NUM_THREADS" not in base:
        env["OMP_NUM_THREADS"] = str(max(1, int(spec.cpus)))
    if spec.framework == "tensorflow":
        workers = [f"{_LOOPBACK}:{p}" for p in ports["tf"]]
        env["TF_CONFIG"] = json.dumps(
            {"cluster": {"worker": workers}, "task": {"type": "worker", "index": rank}}
        )
    if spec.framework == "jax":
        env["JAX_COORDINATOR_ADDRESS"] = f"{_LOOPBACK}:{ports['jax']}"
        env["JAX_NUM_PROCESSES"] = str(spec.workers)
        env["JAX_PROCESS_ID"] = str(rank)
    return env


class RankProcess:
    """A started rank: its pid, pipes, and exit status."""

    def __init__(
        self,
        rank: int,
        pid: int,
        stdout: int,
        stderr: int,
        control: int,
        popen: subprocess.Popen[bytes] | None = None,
    ) -> None:
        self.rank = rank
        self.pid = pid
        self.stdout = stdout
        self.stderr = stderr
        self.control = control
        self.returncode: int | None = None
        self._popen = popen
        try:
            import psutil

            self.create_time: float | None = psutil.Process(pid).create_time()
        except Exception:  # noqa: BLE001 - it may already be gone
            self.create_time = None

    def poll(self) -> int | None:
        if self.returncode is not None:
            return self.returncode
        if self._popen is not None:
            self.returncode = self._popen.poll()
            return self.returncode
        try:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:
            self.returncode = -1
            return self.returncode
        if pid == 0:
            return None
        self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def signal_group(self, signum: int) -> None:
        """Signal the rank's whole process group (its own children too)."""
        try:
            os.killpg(self.pid, signum)
        except OSError as exc:
            if exc.errno not in (errno.ESRCH, errno.EPERM):
                raise


def spawn_cold(
    rank: int, env: dict[str, str], cwd: str | None, stdin: int | None = None
) -> RankProcess:
    """`stdin`: a pipe for the rank's fd 0 (a session rank's commands), else /dev/null."""
    control_r, control_w = os.pipe()
    env = dict(env)
    env["MLCLUSTER_REPORT"] = f"fd:{control_w}"
    env["MLCLUSTER_SUPERVISOR_PID"] = str(os.getpid())
    try:
        popen = subprocess.Popen(
            [sys.executable, "-m", "jupyterlab_mlcluster.runtime.worker"],
            env=env,
            cwd=cwd if cwd and os.path.isdir(cwd) else None,
            stdin=subprocess.DEVNULL if stdin is None else stdin,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            pass_fds=(control_w,),
            start_new_session=True,
        )
    finally:
        os.close(control_w)
    assert popen.stdout is not None and popen.stderr is not None  # both are PIPEs
    return RankProcess(
        rank, popen.pid, popen.stdout.fileno(), popen.stderr.fileno(), control_r, popen
    )


def spawn_forked(
    rank: int, env: dict[str, str], cwd: str | None, payload_path: str, stdin: int | None = None
) -> RankProcess:
    """Fork this (warm, CUDA-clean, single-threaded) process into a rank (`stdin`: as for
    spawn_cold)."""
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    control_r, control_w = os.pipe()
    supervisor = os.getpid()
    pid = os.fork()
    if pid == 0:  # the rank
        status = 1
        try:
            os.setsid()
            for fd in (out_r, err_r, control_r):
                os.close(fd)
            os.dup2(os.open(os.devnull, os.O_RDONLY) if stdin is None else stdin, 0)
            os.dup2(out_w, 1)
            os.dup2(err_w, 2)
            os.close(out_w)
            os.close(err_w)
            child_env = dict(env)
            child_env["MLCLUSTER_REPORT"] = f"fd:{control_w}"
            child_env["MLCLUSTER_SUPERVISOR_PID"] = str(supervisor)
            from ...jobs.warm.rank import become_rank

            status = become_rank(child_env, cwd, payload_path)
        except BaseException:  # noqa: BLE001
            import traceback

            traceback.print_exc()
        finally:
            os._exit(status)
    for fd in (out_w, err_w, control_w):
        os.close(fd)
    return RankProcess(rank, pid, out_r, err_r, control_r)


def stop_ranks(
    ranks: list[RankProcess], grace: float, pump: Callable[[float], None] | None = None
) -> list[int]:
    """SIGTERM every rank's process group, SIGKILL what is left after `grace` seconds;
    returns the ranks that had not exited by then (killed).

    `pump()` is called while waiting so that output keeps being drained (a rank blocked
    on a full pipe could not exit)."""
    live = [r for r in ranks if r.poll() is None]
    for r in live:
        r.signal_group(signal.SIGTERM)
    deadline = time.monotonic() + grace
    while live and time.monotonic() < deadline:
        if pump is not None:
            pump(0.02)
        else:
            time.sleep(0.02)
        live = [r for r in live if r.poll() is None]
    killed = [r.rank for r in live if r.poll() is None]
    for r in ranks:
        # Also the ones that exited: their children may still be in the group (then the
        # group id is still theirs; an empty group's id may be anyone's by now).
        if r.poll() is None or our_group(r.pid):
            r.signal_group(signal.SIGKILL)
    for r in ranks:
        while r.poll() is None:
            time.sleep(0.01)
    return killed
