"""What runs inside every rank: `python -m jupyterlab_mlcluster.runtime.worker`.

It finishes the rank's environment (Kubernetes pods get some variables in other shapes),
ties its life to its supervisor, loads the payload, runs the user's code as `__main__`, and
reports the outcome: rank 0's result, or the failing rank's exception and traceback
(torchrun's error-file idea), on the report channel or in files. Running the code is
user_code.py's, reporting it outcome.py's (a session's rank, session_worker.py, uses both).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import sys
import tempfile
import time

from . import debugger, reporting, scalars, stackdump
from .outcome import error_report, exit_report, write_error, write_result
from .payload import Payload, read_payload_bytes
from .user_code import run_payload, shut_down_like_an_interpreter

_PR_SET_PDEATHSIG = 1


def complete_environment(env: os._Environ | dict[str, str]) -> None:
    """Derive the variables a launcher may have given in another shape (Kubernetes)."""
    if "RANK" not in env and "JOB_COMPLETION_INDEX" in env:
        env["RANK"] = env["JOB_COMPLETION_INDEX"]
    rank = env.get("RANK", "0")
    env.setdefault("WORLD_SIZE", "1")
    env.setdefault("LOCAL_RANK", "0" if "LOCAL_WORLD_SIZE" in env else rank)
    env.setdefault("LOCAL_WORLD_SIZE", "1")
    # The rest of torchrun's worker variables (torch.distributed.elastic's local agent), where
    # the launcher did not set them: one rank per pod is torchrun with one process per node.
    local_world = int(env["LOCAL_WORLD_SIZE"]) if env["LOCAL_WORLD_SIZE"].isdigit() else 1
    if rank.isdigit() and env["WORLD_SIZE"].isdigit() and local_world > 0:
        env.setdefault("GROUP_RANK", str(int(rank) // local_world))
        env.setdefault("GROUP_WORLD_SIZE", str(max(1, int(env["WORLD_SIZE"]) // local_world)))
    env.setdefault("ROLE_NAME", "default")
    env.setdefault("ROLE_RANK", rank)
    env.setdefault("ROLE_WORLD_SIZE", env["WORLD_SIZE"])
    env.setdefault("TORCHELASTIC_RESTART_COUNT", "0")
    env.setdefault("TORCHELASTIC_MAX_RESTARTS", "0")
    if "MLCLUSTER_JOB_ID" in env:
        env.setdefault("TORCHELASTIC_RUN_ID", env["MLCLUSTER_JOB_ID"])
    env.setdefault("TORCHELASTIC_USE_AGENT_STORE", "False")
    env.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    if "TORCHELASTIC_ERROR_FILE" not in env:
        # A pod's rank: `@record` writes here; the worker reads it back on a failed exit.
        env["TORCHELASTIC_ERROR_FILE"] = env.get("MLCLUSTER_ERROR_FILE") or os.path.join(
            tempfile.gettempdir(),
            f"mlcluster-{env.get('MLCLUSTER_JOB_ID', 'job')}-rank{rank}-error.json",
        )
        with contextlib.suppress(OSError):
            if "MLCLUSTER_ERROR_FILE" not in env:
                os.unlink(env["TORCHELASTIC_ERROR_FILE"])  # a previous run's, in the same pod
    if "JAX_COORDINATOR_ADDRESS" in env:
        env.setdefault("JAX_PROCESS_ID", rank)
        env.setdefault("JAX_NUM_PROCESSES", env["WORLD_SIZE"])
    # A pod that packs several ranks (torchrun inside, one rank per GPU slice): each
    # rank sees only its own slice of the pod's GPUs.
    per_rank = env.get("MLCLUSTER_GPUS_PER_RANK")
    if per_rank and per_rank.isdigit() and int(per_rank) > 0 and "LOCAL_RANK" in env:
        visible = env.get("CUDA_VISIBLE_DEVICES")
        devices = (
            visible.split(",")
            if visible
            else [str(i) for i in range(int(env.get("LOCAL_WORLD_SIZE", "1")) * int(per_rank))]
        )
        start = int(env["LOCAL_RANK"]) * int(per_rank)
        env["CUDA_VISIBLE_DEVICES"] = ",".join(devices[start : start + int(per_rank)])
    if "TF_CONFIG" not in env and env.get("MLCLUSTER_TF_WORKERS"):
        workers = env["MLCLUSTER_TF_WORKERS"].split(",")
        env["TF_CONFIG"] = json.dumps(
            {"cluster": {"worker": workers}, "task": {"type": "worker", "index": int(rank)}}
        )


def tie_to_supervisor() -> None:
    """Die with the supervisor (Linux PR_SET_PDEATHSIG), so no rank outlives its job; join
    the job's cgroup first, if it has one, so that nothing this rank starts is born outside
    it (jobs/running/proctree.py)."""
    expected = os.environ.get("MLCLUSTER_SUPERVISOR_PID")
    if not expected or not sys.platform.startswith("linux"):
        return
    procs = os.environ.get("MLCLUSTER_CGROUP_PROCS")  # proctree.CGROUP_ENV
    if procs:
        try:
            with open(procs, "w") as f:
                f.write(str(os.getpid()))
        except OSError:
            pass  # the supervisor moves it in too (Containment.adopt)
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        return
    # The supervisor may have died before prctl took effect: then our parent changed.
    if os.getppid() != int(expected):
        os._exit(137)


def execute(payload: Payload) -> int:
    """Run the payload in this (already set up) process; returns the exit status."""
    rank = int(os.environ.get("RANK", "0"))
    stackdump.arm()  # where the supervisor cannot read this rank from outside
    debugger.arm_outside_session()  # no terminal here: breakpoint() says what to do instead
    reporting.send({"type": "started", "pid": os.getpid(), "time": time.time()})
    status = 0
    try:
        kind, value = run_payload(payload, rank)
        scalars.flush()  # the last points logged go out before the result says it is done
        if rank == 0:
            write_result(kind, value)
    except SystemExit as exc:
        code = exc.code
        if code is None or code == 0:
            status = 0
        else:
            status = code if isinstance(code, int) else 1
            if not isinstance(code, int):
                print(code, file=sys.stderr)
            write_error(exit_report(rank, code))
    except BaseException as exc:  # noqa: BLE001 - every failure must be reported
        report = error_report(rank, exc)
        sys.stderr.write(report["traceback"])
        write_error(report)
        status = 1
    finally:
        scalars.flush()  # (a failed rank's last points too)
        if status:  # the peers waiting for this rank are read before its sockets close
            stackdump.hold_for_peers(reporting.send)
        shut_down_like_an_interpreter()
    return status


def main() -> None:
    complete_environment(os.environ)
    tie_to_supervisor()
    reporting.configure()  # channel, rank and job key, before any user code runs
    if os.environ.get("MLCLUSTER_REPORT") == "stdout":
        # Nobody samples a pod's rank from outside: it reports its own CPU/memory/GPU.
        from .metrics import start_reporting

        start_reporting()
    if os.environ.get("MLCLUSTER_SESSION"):  # a session's rank: cells come on its stdin
        from . import session_worker

        sys.exit(session_worker.serve())
    payload_path = os.environ.get("MLCLUSTER_PAYLOAD")
    if not payload_path:
        sys.exit("jupyterlab_mlcluster.runtime.worker: MLCLUSTER_PAYLOAD is not set")
    try:
        payload = Payload.loads(read_payload_bytes(payload_path))
    except Exception as exc:  # noqa: BLE001 - the caller sees why the rank could not start
        report = error_report(int(os.environ.get("RANK", "0")), exc)
        sys.stderr.write(report["traceback"])
        write_error(report)
        sys.exit(1)
    status = execute(payload)
    sys.exit(status)


if __name__ == "__main__":
    main()
