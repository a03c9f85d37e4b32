"""What runs inside every rank: `python -m jupyterlab_mlcluster.runtime.worker`.

It finishes the rank's environment (Kubernetes pods get some variables in other shapes),
ties its life to its supervisor, loads the payload, runs the user's code as `__main__`, and
reports the outcome: rank 0's result, or the failing rank's exception and traceback
(torchrun's error-file idea), on the report channel or in files.
"""

from __future__ import annotations

import ast
import atexit
import base64
import contextlib
import ctypes
import errno
import gc
import io
import json
import linecache
import os
import runpy
import signal
import sys
import tempfile
import time
import types
from typing import Any

from . import errors, reporting
from .payload import Payload, read_payload_bytes

RESULT_CHUNK = 48 * 1024  # bytes of base64 per stdout record; keeps log lines modest
MIB = 1024 * 1024
# Results pickled bigger than this get no JSON form (REST's GET /jobs/{id}/result says so):
# encoding one costs the rank time every job pays for a read few make (a list of 120k floats,
# 1 MiB pickled, takes ~0.1 s to encode; tensors and arrays fail at once).
JSON_FORM_MAX = 1 * MIB
RESULT_JSON_NAME = "result.json"  # beside MLCLUSTER_RESULT_PATH

_PR_SET_PDEATHSIG = 1


class ResultError(RuntimeError):
    """Rank 0 could not send its result back (undefined --pull name, unpicklable value)."""


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


def run_payload(payload: Payload, rank: int) -> tuple[str, Any]:
    """Run the user's code as __main__. Returns ("value", v), ("pull", {..}) or ("none", None)."""
    if payload.cwd:
        try:
            os.chdir(payload.cwd)
        except OSError:
            pass  # a pod has no such directory; its image's workdir will do
    sys.path[:] = fresh_sys_path(payload)
    # What `python script.py` / `python -m mod` would show; a cell gets `python -c`'s.
    sys.argv = (
        [payload.filename, *payload.argv] if payload.kind != "code" or payload.argv else ["-c"]
    )

    if payload.kind == "callable":
        value = payload.function(*payload.args, **payload.kwargs)  # type: ignore[misc]
        return ("value", value) if value is not None else ("none", None)

    main = types.ModuleType("__main__")
    main.__dict__.update(payload.push)
    main.__dict__["__builtins__"] = __builtins__
    saved_main = sys.modules.get("__main__")
    sys.modules["__main__"] = main  # pickling classes defined in the cell needs this
    try:
        if payload.kind == "script":
            main.__dict__.update(
                runpy.run_path(payload.filename, init_globals=main.__dict__, run_name="__main__")
            )
            value = None
        elif payload.kind == "module":
            main.__dict__.update(
                runpy.run_module(payload.filename, run_name="__main__", alter_sys=True)
            )
            value = None
        else:
            value = _exec_cell(payload.source, payload.filename, main.__dict__)
    finally:
        if saved_main is not None:
            sys.modules["__main__"] = saved_main
    if payload.pull:
        missing = [name for name in payload.pull if name not in main.__dict__]
        if missing:
            raise ResultError(
                f"--pull {', '.join(missing)}: not defined on rank {rank} after the cell ran"
            )
        return "pull", {name: main.__dict__[name] for name in payload.pull}
    return ("value", value) if value is not None else ("none", None)


def fresh_sys_path(payload: Payload) -> list[str]:
    """sys.path as a fresh interpreter running this payload would have it.

    This process was started as `python -m ...` (cold) or forked from one (warm: the pool's),
    which put its own start directory first; a fresh `python script.py` puts the script's
    directory there instead, `python -m mod` the working directory, and a cell gets the
    kernel's path (with its '' entry: modules next to the notebook import)."""
    base = list(sys.path) if sys.flags.safe_path else sys.path[1:]
    if payload.kind == "script":
        first = [] if sys.flags.safe_path else [os.path.dirname(os.path.abspath(payload.filename))]
    elif payload.kind == "module":
        first = [] if sys.flags.safe_path else [os.getcwd()]
    else:
        first = list(payload.sys_path) or [""]
    path = list(first)
    for entry in base:
        if entry not in path:
            path.append(entry)
    return path


def _exec_cell(source: str, filename: str, namespace: dict[str, Any]) -> Any:
    """exec the cell; like IPython, a final bare expression is evaluated and returned."""
    lines = source.splitlines(keepends=True)
    linecache.cache[filename] = (len(source), None, lines, filename)
    tree = ast.parse(source, filename=filename, mode="exec")
    last = None
    final = tree.body[-1] if tree.body else None
    if isinstance(final, ast.Expr):
        tree.body.pop()
        last = ast.Expression(final.value)
    exec(compile(tree, filename, "exec"), namespace)
    if last is not None:
        return eval(compile(last, filename, "eval"), namespace)
    return None


def write_result(kind: str, value: Any) -> None:
    """Rank 0's result, twice: the pickle only the owner's kernel or process reads, and its
    JSON form (or the types that have none) that servers serve: a server never unpickles,
    since whoever wrote the job chose what the unpickling would run."""
    import cloudpickle

    try:
        data = cloudpickle.dumps({"kind": kind, "value": value})
    except Exception as exc:  # noqa: BLE001
        raise ResultError(
            f"cannot send the result back to the kernel: {type(exc).__name__}: {exc}"
        ) from None
    limit = max_result_bytes()
    if limit and len(data) > limit:
        raise ResultError(
            f"the result is {len(data) / MIB:.1f} MiB, more than this job may return "
            f"({limit / MIB:g} MiB, MLClusterConfig.max_result_mib): save it to a file instead"
        )
    json_form = result_json(kind, value, len(data))
    path = os.environ.get("MLCLUSTER_RESULT_PATH")
    if path:
        # Beside the pickle, whichever backend named it (JobStore.result_json_path).
        json_path = os.path.join(os.path.dirname(path), RESULT_JSON_NAME)
        try:
            _write_whole(json_path, json_form)
            try:
                _write_whole(path, data)
            except BaseException:
                with contextlib.suppress(OSError):  # no half of a result
                    os.unlink(json_path)
                raise
        except OSError as exc:
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            raise ResultError(
                f"no space left on the device holding {path}: the result"
                f" ({len(data)} bytes) cannot be written ({exc.strerror})"
            ) from None
        return
    # The JSON form first: the pickle's last chunk completes the result.
    _send_chunks(json_form, "json")
    _send_chunks(data, None)


def _send_chunks(data: bytes, form: str | None) -> None:
    encoded = base64.b64encode(data).decode()
    chunks = [encoded[i : i + RESULT_CHUNK] for i in range(0, len(encoded), RESULT_CHUNK)] or [""]
    for index, chunk in enumerate(chunks):
        record = {"type": "result", "index": index, "count": len(chunks), "data": chunk}
        if form:
            record["form"] = form
        reporting.send(record)


def max_result_bytes() -> int:
    """The job's cap on its pickled result (MLCLUSTER_MAX_RESULT_BYTES, set by the backend;
    0 or unset: none)."""
    try:
        return max(0, int(os.environ.get("MLCLUSTER_MAX_RESULT_BYTES", "0")))
    except ValueError:
        return 0


def result_json(kind: str, value: Any, pickled_size: int) -> bytes:
    """{"kind", "value"} where the value has a JSON form, else {"kind", "types"} saying
    which types have none (what a server's 409 says). A value whose pickle is bigger than
    JSON_FORM_MAX is not encoded twice (that would slow every big result for a REST read
    few make)."""
    if pickled_size <= JSON_FORM_MAX:
        try:
            return json.dumps({"kind": kind, "value": value}, allow_nan=False).encode()
        except (TypeError, ValueError, RecursionError):
            pass
        return json.dumps({"kind": kind, "types": _type_names(value)}).encode()
    return json.dumps(
        {
            "kind": kind,
            "types": f"{_type_names(value)}, {pickled_size / MIB:.1f} MiB pickled (more than "
            f"{JSON_FORM_MAX // MIB} MiB)",
        }
    ).encode()


def _type_names(value: Any) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{k}: {type(v).__name__}" for k, v in value.items())
    return type(value).__name__


def _write_whole(path: str, data: bytes) -> None:
    """`path` holds all of `data` or is untouched; a failed write (a full disk) leaves no
    partial temporary file behind to keep the disk full."""
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        # 0600: a pulled result may hold anything of the user's (data, tokens); nobody
        # else on the machine may read it while it waits for delivery.
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def error_report(rank: int, exc: BaseException) -> dict[str, Any]:
    # Only the user's frames: not the runtime's, not runpy's (`python script.py` has neither).
    return {
        "rank": rank,
        "exc_type": type(exc).__name__,
        "message": str(exc),
        "traceback": errors.format_user_traceback(exc),
        "timestamp": time.time(),
        "pid": os.getpid(),
    }


def exit_report(rank: int, code: Any) -> dict[str, Any]:
    """A non-zero sys.exit: what `@record` wrote before it (torchrun's root cause), if any."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    recorded = errors.read_error_file(path, rank) if path else None
    if recorded is not None:
        return {**recorded, "pid": os.getpid()}
    return {
        "rank": rank,
        "exc_type": "SystemExit",
        "message": f"exit status {code}",
        "traceback": f"SystemExit: {code}\n",
        "timestamp": time.time(),
        "pid": os.getpid(),
    }


def write_error(report: dict[str, Any]) -> None:
    path = os.environ.get("MLCLUSTER_ERROR_FILE")
    if path:
        try:
            _write_whole(path, json.dumps(report).encode())
            return
        except OSError as exc:
            # A full disk: the report goes over the report channel instead (the supervisor
            # keeps it in memory), so the job still says why this rank failed.
            print(f"mlcluster: cannot write {path}: {exc}", file=sys.stderr)
    reporting.send({"type": "error", **report})


def _shutdown_process_group() -> None:
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
    except Exception:  # noqa: BLE001 - best effort on the way out
        pass


def execute(payload: Payload) -> int:
    """Run the payload in this (already set up) process; returns the exit status."""
    rank = int(os.environ.get("RANK", "0"))
    reporting.send({"type": "started", "pid": os.getpid(), "time": time.time()})
    status = 0
    try:
        kind, value = run_payload(payload, rank)
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
        shut_down_like_an_interpreter()
    return status


def shut_down_like_an_interpreter() -> None:
    """What Python does after a script's last line (Py_FinalizeEx), in its order, so that a
    warm rank (which leaves with os._exit: it shares the pool's inherited state) loses nothing
    a fresh `python script.py` would keep: wait for non-daemon threads, run atexit handlers
    (also multiprocessing's, which stops daemonic children such as DataLoader workers), then
    flush every file the user left open."""
    threading = sys.modules.get("threading")
    if threading is not None:
        with contextlib.suppress(Exception):
            threading._shutdown()  # joins non-daemon threads
    atexit._run_exitfuncs()  # prints and skips a failing handler, as at interpreter exit
    _shutdown_process_group()
    _flush_open_files()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()


def _flush_open_files() -> None:
    """Flush buffered files nobody closed (a fresh interpreter's finalizers would).

    Needed in cold ranks too: a script's globals live on in runpy's namespace, which
    interpreter finalization does not clear the way it clears `__main__` (measured: the data
    of a file left open was lost). A warm rank's inherited objects are frozen (gc.freeze) and
    so not listed: only what the rank made is visited. Text layers first: they write into
    their binary buffers."""
    text, binary = [], []
    for obj in gc.get_objects():
        kind = type(obj)  # not isinstance: a dead weakref proxy raises on __class__
        if issubclass(kind, io.TextIOWrapper):
            text.append(obj)
        elif issubclass(kind, (io.BufferedWriter, io.BufferedRandom)):
            binary.append(obj)
    for stream in text + binary:
        with contextlib.suppress(Exception):
            if not stream.closed:
                stream.flush()


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
    payload = Payload.loads(read_payload_bytes(payload_path))
    status = execute(payload)
    sys.exit(status)


if __name__ == "__main__":
    main()
