"""A session's rank: a long-lived worker that runs cell after cell in the same globals.

Started like any rank (cold, or forked warm from the pool; runtime/worker.py and
jobs/warm/rank.py hand over here when $MLCLUSTER_SESSION is set), it reads commands from its
stdin, a pipe only its supervisor holds (backends/local/session.py); in a Kubernetes pod or
a Slurm task ($MLCLUSTER_SESSION_CHANNEL=tcp), from a connection that proved the job's key
(session_channel.py), cells inline (a pod's) or in the shared filesystem (a task's). Each
command is one line signed like the ranks' own reports (runtime/protocol.py: an HMAC-SHA256
over this rank's number and the JSON, with a sequence number that only goes up), so nothing
else can make it run code, nor replay an old cell. The key: the session's own on the
private pipe; on a pod's connection, that connection's (session_channel.connection_key,
from the job's key and both ends' handshake nonces), so a line recorded on the network is
refused on any other connection, a restarted session's pods included:

    {"type": "cell", "seq": n, "job": <cell job id>, "payload": <path>, "error": <path>,
     "result": <path, rank 0 only>, "env": {...}}
    {"type": "stop", "seq": n}

A cell runs as `__main__` in this rank's persistent module (so `model` defined by one cell is
there in the next), with what a fresh interpreter would have at the time of the cell: the
cell's environment, working directory and sys.path, and notebook-local modules changed on
disk since they were imported are imported afresh. SIGINT raises KeyboardInterrupt in the
cell's code (the supervisor's interrupt); between cells it is ignored. After each cell the
rank sends a signed `cell_done` report (status ok, error or interrupted); a failure's
report and traceback go to the cell's error file as a job's do. `stop` (the session's end)
shuts down as an interpreter would: atexit handlers run.
"""

from __future__ import annotations

import base64
import builtins
import contextlib
import os
import signal
import sys
import types
import zlib
from typing import Any

from . import debugger, outcome, reporting, scalars, user_code
from .payload import Payload, read_payload_bytes
from .protocol import decode_record, key_path, read_key_file

# Variables a cell's environment never overrides: how this rank talks to its supervisor.
_RANK_OWN_PREFIXES = ("MLCLUSTER_REPORT", "MLCLUSTER_SUPERVISOR_PID", "MLCLUSTER_CGROUP")


class _CellState:
    running = False  # SIGINT raises KeyboardInterrupt only while a cell's code runs
    job: str | None = None  # the cell running (a pod's interrupt names it)


def _on_sigint(signum: int, frame: Any) -> None:
    if _CellState.running:
        raise KeyboardInterrupt


class SessionRank:
    def __init__(self, commands: int | None):
        self.rank = int(os.environ.get("RANK", "0"))
        payload = os.environ.get("MLCLUSTER_PAYLOAD", "")
        self.key = read_key_file(key_path(payload)) if payload else None
        # A pod's rank: its commands come over the network instead (session_channel.py).
        self.commands: Any = _Pipe(commands, self.key) if commands is not None else None
        self.seq = 0
        self.main = types.ModuleType("__main__")
        self.main.__dict__["__builtins__"] = builtins
        self.initial_path = list(sys.path)
        self.applied_env: dict[str, str] = {}
        self.local_modules: dict[str, tuple[str, int]] = {}  # name -> (file, mtime_ns)
        self.local_dirs: list[str] = []
        # Modules already judged local or not (name -> id of the module object then), for
        # these local directories: once each, not after every cell (a rank that imported
        # torch has thousands of modules).
        self.looked_at: dict[str, int] = {}
        self.looked_at_for: list[str] = []

    # -- commands ------------------------------------------------------------------------

    def read_command(self) -> dict[str, Any] | None:
        """The next authentic command; None once the supervisor is gone (end of file)."""
        while True:
            try:
                raw, key = self.commands.read()
            except KeyboardInterrupt:  # a late interrupt between cells: nothing to stop
                continue
            if not raw:
                return None
            record = decode_record(raw.rstrip(b"\n"), key, self.rank)
            seq = record.get("seq") if record else None
            if not isinstance(seq, int) or seq <= self.seq:
                print(
                    f"mlcluster session: rank {self.rank} ignored a command that was not"
                    " signed with the session's key (or was replayed)",
                    file=sys.stderr,
                )
                continue
            self.seq = seq
            return record

    def serve(self) -> int:
        sys.modules["__main__"] = self.main  # pickling classes defined in a cell needs this
        signal.signal(signal.SIGINT, _on_sigint)
        debugger.arm_in_session()
        reporting.send({"type": "started", "pid": os.getpid()})
        while True:
            command = self.read_command()
            if command is None or command.get("type") == "stop":
                break
            if command.get("type") == "cell":
                status = self.run_cell(command)
                with contextlib.suppress(Exception):
                    # The cell's last `mlc.log` points before its end: they are the cell's
                    # (a session's supervisor puts them in its running cell's series).
                    scalars.flush()
                    sys.stdout.flush()
                    sys.stderr.flush()
                # After the output: the supervisor drains the pipes when this arrives.
                reporting.send({"type": "cell_done", "job": command.get("job"), "status": status})
        user_code.shut_down_like_an_interpreter()  # atexit handlers, as at interpreter exit
        return 0

    # -- one cell ------------------------------------------------------------------------

    def apply_environment(self, env: dict[str, str]) -> None:
        """The cell's environment: what its submitter had (and the rank's own variables),
        with what the previous cell's had and this one's has not removed. What the user's
        code set itself stays."""
        env = {k: v for k, v in env.items() if not k.startswith(_RANK_OWN_PREFIXES)}
        for key in set(self.applied_env) - set(env):
            os.environ.pop(key, None)
        for key, value in env.items():
            if os.environ.get(key) != value:
                os.environ[key] = value
        self.applied_env = env

    def forget_changed_local_modules(self) -> None:
        """A notebook-local module edited since a cell imported it is imported afresh by the
        next `import` (a fresh interpreter would read the file as it is now)."""
        for name, (path, mtime) in list(self.local_modules.items()):
            try:
                changed = os.stat(path).st_mtime_ns != mtime
            except OSError:
                changed = True
            if changed:
                sys.modules.pop(name, None)
                del self.local_modules[name]
                self.looked_at.pop(name, None)

    def remember_local_modules(self) -> None:
        """The notebook-local modules the cell imported: under a local directory, and not
        an installed package's (a project's own .venv often lies inside the notebook's
        directory: its thousand modules would be looked at before every cell)."""
        if not self.local_dirs:
            return
        if self.local_dirs != self.looked_at_for:  # other directories: judge them all again
            self.looked_at.clear()
            self.looked_at_for = list(self.local_dirs)
        for name, module in list(sys.modules.items()):
            if self.looked_at.get(name) == id(module) or name in self.local_modules:
                continue
            self.looked_at[name] = id(module)
            path = getattr(module, "__file__", None)
            if not path or name == "__main__":
                continue
            path = os.path.abspath(path)
            if _installed(path):
                continue
            if any(path.startswith(d + os.sep) for d in self.local_dirs):
                with contextlib.suppress(OSError):
                    self.local_modules[name] = (path, os.stat(path).st_mtime_ns)

    def interrupt(self, job: str | None) -> None:
        """A pod's interrupt (session_channel.py): only the cell it names is stopped."""
        if _CellState.running and job == _CellState.job:
            os.kill(os.getpid(), signal.SIGINT)

    def run_cell(self, command: dict[str, Any]) -> str:
        self.apply_environment(dict(command.get("env") or {}))
        os.environ["MLCLUSTER_JOB_CELL"] = str(command.get("job"))
        if command.get("error"):
            os.environ["MLCLUSTER_ERROR_FILE"] = str(command.get("error"))
            os.environ["TORCHELASTIC_ERROR_FILE"] = str(command.get("error"))
        # (A pod's rank gets no files: its result and errors go on the report channel.)
        if command.get("result"):
            os.environ["MLCLUSTER_RESULT_PATH"] = str(command["result"])
        try:
            try:
                payload = Payload.loads(_payload_bytes(command))
                _CellState.job = str(command.get("job"))
                debugger.cell_begins(command.get("error"))  # breakpoint()'s pdb: beside it
                _CellState.running = True
                kind, value = self.run_payload(payload)
            finally:
                _CellState.running = False
                debugger.cell_ends()
                self.remember_local_modules()
            if self.rank == 0:
                outcome.write_result(kind, value)
            return "ok"
        except KeyboardInterrupt:
            print(f"KeyboardInterrupt (rank {self.rank})", file=sys.stderr)
            return "interrupted"
        except SystemExit as exc:
            if exc.code is None or exc.code == 0:
                return "ok"
            outcome.write_error(outcome.exit_report(self.rank, exc.code))
            return "error"
        except BaseException as exc:  # noqa: BLE001 - every failure must be reported
            report = outcome.error_report(self.rank, exc)
            sys.stderr.write(report["traceback"])
            outcome.write_error(report)
            debugger.keep_last_failure(exc)
            return "error"

    def run_payload(self, payload: Payload) -> tuple[str, Any]:
        """user_code.run_payload, in this rank's persistent `__main__`."""
        if payload.cwd:
            with contextlib.suppress(OSError):
                os.chdir(payload.cwd)
        sys.path[:] = self.initial_path
        sys.path[:] = user_code.fresh_sys_path(payload)
        self.local_dirs = _local_dirs(payload)
        self.forget_changed_local_modules()
        payload.unpack()  # the caller's objects: their modules import from the path just set
        sys.argv = ["-c", *payload.argv] if payload.kind == "code" else [payload.filename]
        namespace = self.main.__dict__
        namespace.update(payload.push)
        sys.modules["__main__"] = self.main
        if payload.kind == "callable":
            value = payload.function(*payload.args, **payload.kwargs)  # type: ignore[misc]
        elif payload.kind == "code":
            value = user_code._exec_cell(
                payload.source, payload.filename, namespace, payload.first_line
            )
        else:
            raise outcome.ResultError(f"a session runs cells, not a {payload.kind}")
        if payload.pull:
            missing = [name for name in payload.pull if name not in namespace]
            if missing:
                raise outcome.ResultError(
                    f"--pull {', '.join(missing)}: not defined on rank {self.rank} after the"
                    " cell ran"
                )
            return "pull", {name: namespace[name] for name in payload.pull}
        return ("value", value) if value is not None else ("none", None)


class _Pipe:
    """A local rank's commands: lines on its private pipe, signed with the session's key
    (the same `read()` as a pod's session_channel.CommandChannel)."""

    def __init__(self, fd: int, key: bytes | None):
        self.file, self.key = os.fdopen(fd, "rb"), key

    def read(self) -> tuple[bytes, bytes | None]:
        return self.file.readline(), self.key

    def close(self) -> None:
        self.file.close()


def _installed(path: str) -> bool:
    """`path` (absolute) lies in this interpreter's installation or an installed package's
    directory: not the notebook's own."""
    prefixes = {os.path.abspath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    if any(path == p or path.startswith(p + os.sep) for p in prefixes):
        return True
    return "site-packages" in path or "dist-packages" in path


def _payload_bytes(command: dict[str, Any]) -> bytes:
    """The cell's payload: a file the supervisor wrote (local), or inline (a pod's:
    compressed as backends/kubernetes/payload.py's chunks are)."""
    if "payload_data" in command:
        return zlib.decompress(base64.b64decode(command["payload_data"]))
    return read_payload_bytes(command["payload"])


def _local_dirs(payload: Payload) -> list[str]:
    """The directories whose modules are the notebook's own (not installed packages)."""
    dirs = []
    for entry in [payload.cwd or "", *payload.sys_path]:
        path = os.path.abspath(entry or payload.cwd or os.getcwd())
        if not _installed(path) and path not in dirs:
            dirs.append(path)
    return dirs


def serve() -> int:
    """Entry point, once the rank is set up (environment, supervisor tie, report channel)."""
    # A pod's rank, or a Slurm task (on a node of its own: no pipe reaches it), listens.
    in_pod = os.environ.get("MLCLUSTER_REPORT") == "stdout"
    networked = in_pod or os.environ.get("MLCLUSTER_SESSION_CHANNEL") == "tcp"
    commands = None if networked else os.dup(0)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)  # the user's code reads an empty stdin, as a job's does
    os.close(devnull)
    rank = SessionRank(commands)
    if networked:
        from .session_channel import CommandChannel

        if rank.key is None:
            sys.exit("mlcluster session: no job key beside the payload; refusing to listen")
        rank.commands = CommandChannel(rank.key, rank.rank, rank.interrupt)
    return rank.serve()
