"""The warm pool: a CUDA-clean zygote that has already imported the heavy modules.

Starting a rank cold costs a Python start plus `import torch` (seconds); accelerate's
notebook_launcher avoids that by forking the notebook kernel, which breaks once CUDA has
been initialised there. The zygote gives both: it is a separate, single-threaded process
that imports torch (and friends) but never touches CUDA, and it forks on request.

    submitter --(unix socket: spawn_supervisor)--> zygote --fork--> supervisor --fork--> ranks

The forked supervisor forks the ranks itself (it is still single-threaded and
CUDA-clean), so ranks are its real children: exit statuses, PR_SET_PDEATHSIG and
process groups work exactly as for cold ranks. Each rank then gets its own environment
(CUDA_VISIBLE_DEVICES before any CUDA use), fresh random seeds, and its own stdio.

One zygote per environment fingerprint (interpreter, import-relevant variables, installed
packages): installing a package changes site-packages' mtime, hence the fingerprint, hence
the zygote; a stale one notices and exits. An unused zygote exits after an idle timeout.

Trust: the submitter sends its whole environment (tokens, cloud keys) to the zygote, so the
socket must be this user's and nobody else's. It lives in a directory this user owns with
mode 0700, checked with lstat (owner, mode, not a link) before every use:
$MLCLUSTER_WARM_POOL_DIR when set, else $XDG_RUNTIME_DIR/mlcluster, $TMPDIR/mlcluster-<uid>,
~/.cache/jupyterlab-mlcluster/warm-pool, the first that passes. One that fails is never
used nor touched (someone else may have made it); with none, jobs start cold and a warning
says why. Files in it are opened with O_NOFOLLOW; both ends check the other's uid
(SO_PEERCRED) before a word is said.
"""

from __future__ import annotations

import contextlib
import fcntl
import gc
import hashlib
import importlib
import io
import json
import logging
import os
import selectors
import signal
import socket
import stat
import struct
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path
from typing import Any

from .._version import __version__
from .processes import start_detached

_IN_ZYGOTE_CHILD = False
_ENV_KEYS = (
    "PYTHONPATH",
    "PYTHONHOME",
    "LD_LIBRARY_PATH",
    "VIRTUAL_ENV",
    "CONDA_PREFIX",
    "CUDA_HOME",
)
START_TIMEOUT = 60.0
_OWN_MODULES = (
    "jupyterlab_mlcluster.jobs.supervisor",
    "jupyterlab_mlcluster.backends.local.backend",
    "jupyterlab_mlcluster.runtime.worker",
    "jupyterlab_mlcluster.config",
    "jupyter_core.paths",
    "cloudpickle",
    "psutil",
)
REQUEST_TIMEOUT = 10.0
SELF_CHECK_INTERVAL = 5.0


def in_zygote_child() -> bool:
    """True in a supervisor forked from the zygote: it may fork warm ranks."""
    return _IN_ZYGOTE_CHILD


# -- identity -----------------------------------------------------------------------------


class UnsafePoolDir(RuntimeError):
    """No directory the warm pool may trust: jobs start cold."""


log = logging.getLogger("jupyterlab_mlcluster.warmpool")
_MAX_SOCKET_PATH = 107  # bytes of sun_path on Linux, less the terminating NUL
_SOCKET_NAME_BYTES = len("/zygote-0123456789abcdef.4194304.tmp")
_warned: set[str] = set()


def dir_problem(path: str | os.PathLike[str]) -> str | None:
    """Why `path` must not hold the pool's socket (None: it is this user's own: a real
    directory, not a link, owned by us, no access for group or others)."""
    try:
        info = os.lstat(path)
    except OSError as exc:
        return f"{path}: {exc.strerror}"
    if stat.S_ISLNK(info.st_mode):
        return f"{path} is a symbolic link"
    if not stat.S_ISDIR(info.st_mode):
        return f"{path} is not a directory"
    if info.st_uid != os.getuid():
        return f"{path} belongs to uid {info.st_uid}, not to this user (uid {os.getuid()})"
    if stat.S_IMODE(info.st_mode) & 0o077:
        return f"{path} has mode {stat.S_IMODE(info.st_mode):04o}, not 0700"
    return None


def _own_dir(path: str) -> str | None:
    """Make `path` ours (0700) if it does not exist; then check it. The problem, or None."""
    if len(os.fsencode(path)) + _SOCKET_NAME_BYTES > _MAX_SOCKET_PATH:
        return f"{path} is too long a path for a unix socket"
    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass  # someone's: checked below, never changed
    except OSError as exc:
        return f"{path}: {exc.strerror}"
    return dir_problem(path)


def _candidates() -> list[str]:
    explicit = os.environ.get("MLCLUSTER_WARM_POOL_DIR")
    if explicit:
        return [explicit]  # what the user chose, or nothing
    found = []
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and dir_problem(runtime) is None:
        found.append(os.path.join(runtime, "mlcluster"))
    found.append(os.path.join(tempfile.gettempdir(), f"mlcluster-{os.getuid()}"))
    found.append(
        os.path.join(os.path.expanduser("~"), ".cache", "jupyterlab-mlcluster", "warm-pool")
    )
    return found


def pool_dir() -> Path:
    """The first safe candidate (module docstring); UnsafePoolDir when none is."""
    problems = []
    for candidate in _candidates():
        problem = _own_dir(candidate)
        if problem is None:
            if problems:
                _warn_once(f"warm pool: not using {'; '.join(problems)}; using {candidate}")
            return Path(candidate)
        problems.append(problem)
    raise UnsafePoolDir(
        f"warm pool off, jobs start cold: no directory of this user's own for its socket "
        f"({'; '.join(problems)})"
    )


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        log.warning("%s", message)
        warnings.warn(message, RuntimeWarning, stacklevel=3)


def _open_private(path: Path, flags: int) -> int:
    """An fd for a file in the pool directory: never through a link, 0600 when created."""
    return os.open(path, flags | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)


def peer_uid(conn: socket.socket) -> int:
    """The uid of the process at the other end of a unix socket (SO_PEERCRED)."""
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[1]


def _site_dirs() -> list[str]:
    import site

    dirs = list(site.getsitepackages()) if hasattr(site, "getsitepackages") else []
    with contextlib.suppress(Exception):
        dirs.append(site.getusersitepackages())
    return dirs


def fingerprint(modules: list[str], env: dict[str, str] | None = None) -> str:
    """What a warm interpreter depends on; any change means a new zygote."""
    env = os.environ if env is None else env
    parts: list[Any] = [os.path.realpath(sys.executable), sys.version, __version__, sorted(modules)]
    parts += [(k, env.get(k, "")) for k in _ENV_KEYS]
    # `pip install` (also `--target` into a PYTHONPATH entry) changes the directory's mtime.
    extra = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    for d in _site_dirs() + extra:
        try:
            parts.append((d, os.stat(d).st_mtime_ns))
        except OSError:
            parts.append((d, None))
    return hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest()[:16]


def socket_path(fp: str) -> Path:
    return pool_dir() / f"zygote-{fp}.sock"


# -- client ---------------------------------------------------------------------------------


def request(
    path: Path, message: dict[str, Any], timeout: float = REQUEST_TIMEOUT
) -> dict[str, Any]:
    """One request to a zygote; only to a socket file of ours (lstat) whose listening process
    is ours (SO_PEERCRED): the message may carry the whole environment."""
    info = os.lstat(path)
    if not stat.S_ISSOCK(info.st_mode) or info.st_uid != os.getuid():
        raise ConnectionRefusedError(f"{path} is not a socket of this user's")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect(str(path))
        if peer_uid(s) != os.getuid():
            raise ConnectionRefusedError(f"{path} is served by another user's process")
        s.sendall(json.dumps(message).encode() + b"\n")
        data = b""
        while not data.endswith(b"\n"):
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    if not data:
        raise ConnectionError("the warm pool closed the connection")
    reply = json.loads(data)
    if "error" in reply:
        raise RuntimeError(reply["error"])
    return reply


def ensure_zygote(config, wait: bool = True) -> Path | None:
    """The socket of a ready zygote for this environment, starting one if needed.

    With wait=False, returns None at once when none is ready yet (it keeps starting)."""
    modules = list(config.warm_pool_modules)
    fp = fingerprint(modules)
    try:
        path = socket_path(fp)
    except UnsafePoolDir as exc:
        _warn_once(str(exc))
        return None
    if _ping(path):
        return path
    lock_fd = _open_private(path.parent / f"zygote-{fp}.lock", os.O_WRONLY)
    with os.fdopen(lock_fd, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one starter per fingerprint, across processes
        if not _ping(path):
            _retire_others(fp)
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            zygote_log = os.fdopen(
                _open_private(path.parent / f"zygote-{fp}.log", os.O_WRONLY | os.O_APPEND), "ab"
            )
            start_detached(
                [
                    sys.executable,
                    "-m",
                    "jupyterlab_mlcluster.jobs.warmpool",
                    str(path),
                    ",".join(modules),
                    str(config.warm_pool_idle_timeout),
                    fp,
                ],
                zygote_log,
                cwd="/",  # so a user's ./torch or ./numpy can never shadow the real ones here
            )
    if not wait:
        return None
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if _ping(path):
            return path
        time.sleep(0.05)
    return None


def _ping(path: Path) -> bool:
    if not os.path.lexists(path):
        return False
    try:
        return request(path, {"op": "ping"}, timeout=2.0).get("ok", False)
    except (OSError, ValueError, RuntimeError):
        return False


def _retire_others(keep: str) -> None:
    """Ask zygotes of an outdated environment of this interpreter to exit."""
    for path in pool_dir().glob("zygote-*.sock"):
        if path.name == f"zygote-{keep}.sock":
            continue
        with contextlib.suppress(OSError, ValueError, RuntimeError):
            info = request(path, {"op": "ping"}, timeout=1.0)
            if info.get("executable") == os.path.realpath(sys.executable):
                request(path, {"op": "stop"}, timeout=1.0)


def spawn_supervisor(config, store_root: str, job_id: str) -> bool:
    """Fork the job's supervisor from the zygote. False: use a cold start instead."""
    path = ensure_zygote(config)
    if path is None:
        return False
    try:
        request(
            path,
            {"op": "spawn_supervisor", "store": store_root, "job": job_id, "env": dict(os.environ)},
        )
    except (OSError, ValueError, RuntimeError):
        return False
    return True


def status(config) -> dict[str, Any] | None:
    try:
        path = socket_path(fingerprint(list(config.warm_pool_modules)))
        return request(path, {"op": "status"}, timeout=2.0)
    except (OSError, ValueError, RuntimeError):  # UnsafePoolDir among them
        return None


def stop(config) -> bool:
    try:
        path = socket_path(fingerprint(list(config.warm_pool_modules)))
        request(path, {"op": "stop"}, timeout=2.0)
        return True
    except (OSError, ValueError, RuntimeError):
        return False


# -- the zygote -------------------------------------------------------------------------------


class Zygote:
    def __init__(self, path: Path, modules: list[str], idle_timeout: float, fp: str):
        self.path = path
        self.modules = modules
        self.idle_timeout = idle_timeout
        self.fp = fp
        self.imported: list[str] = []
        self.children: set[int] = set()
        self.last_used = time.monotonic()
        self.running = True
        self.started = time.time()

    def preload(self) -> None:
        for name in _OWN_MODULES:  # what every supervisor and rank needs anyway
            importlib.import_module(name)
        for name in self.modules:
            try:
                importlib.import_module(name)
                self.imported.append(name)
            except ImportError:
                continue
        if self.cuda_initialized():
            raise SystemExit(
                "warm pool: a preloaded module initialised CUDA; forking would be unsafe"
            )
        # Everything imported so far lives as long as we do. Frozen objects are never
        # scanned by the collector, so no fork pays for a full collection of torch's heap
        # (~150 ms here) nor copies every page it would touch doing so.
        gc.collect()
        gc.freeze()

    @staticmethod
    def cuda_initialized() -> bool:
        torch = sys.modules.get("torch")
        return bool(torch is not None and torch.cuda.is_initialized())

    @staticmethod
    def thread_count() -> int:
        """Python threads. (torch keeps one native helper thread from import on; forking
        past it is what DataLoader workers do every day, and it holds no Python state.)"""
        return threading.active_count()

    def serve(self) -> None:
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        tmp = self.path.with_suffix(f".{os.getpid()}.tmp")
        listener.bind(str(tmp))
        os.chmod(tmp, 0o600)
        listener.listen(64)
        os.replace(tmp, self.path)  # appear only when ready
        selector = selectors.DefaultSelector()
        selector.register(listener, selectors.EVENT_READ)
        last_check = time.monotonic()
        try:
            while self.running:
                for _key, _ in selector.select(timeout=1.0):
                    conn, _ = listener.accept()
                    with conn:
                        # Only this user's processes may ask; others are hung up on.
                        if peer_uid(conn) == os.getuid():
                            self._handle(conn)
                self._reap()
                now = time.monotonic()
                if now - self.last_used > self.idle_timeout:
                    break
                if now - last_check > SELF_CHECK_INTERVAL:
                    last_check = now
                    if fingerprint(self.modules) != self.fp:  # packages changed under us
                        break
        finally:
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()
            listener.close()

    def _reap(self) -> None:
        for pid in list(self.children):
            with contextlib.suppress(ChildProcessError):
                done, _ = os.waitpid(pid, os.WNOHANG)
                if not done:
                    continue
            self.children.discard(pid)

    def _handle(self, conn: socket.socket) -> None:
        conn.settimeout(REQUEST_TIMEOUT)
        data = b""
        while not data.endswith(b"\n"):
            chunk = conn.recv(1 << 20)
            if not chunk:
                return
            data += chunk
        try:
            message = json.loads(data)
            reply = self._dispatch(message)
        except Exception as exc:  # noqa: BLE001 - report, keep serving
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        with contextlib.suppress(OSError):
            conn.sendall(json.dumps(reply).encode() + b"\n")

    def _dispatch(self, message: dict[str, Any]) -> dict[str, Any]:
        op = message.get("op")
        if op == "ping":
            return {
                "ok": True,
                "pid": os.getpid(),
                "fingerprint": self.fp,
                "executable": os.path.realpath(sys.executable),
            }
        if op == "status":
            import psutil

            mem = psutil.Process().memory_full_info()
            return {
                "ok": True,
                "pid": os.getpid(),
                "fingerprint": self.fp,
                "modules": self.imported,
                "cuda_initialized": self.cuda_initialized(),
                "threads": self.thread_count(),
                "rss_bytes": mem.rss,
                "uss_bytes": getattr(mem, "uss", None),
                "children": len(self.children),
                "uptime": time.time() - self.started,
            }
        if op == "stop":
            self.running = False
            return {"ok": True}
        if op == "spawn_supervisor":
            self.last_used = time.monotonic()
            if self.thread_count() != 1 or self.cuda_initialized():
                raise RuntimeError("zygote is no longer fork-safe")
            pid = os.fork()
            if pid == 0:
                _run_forked_supervisor(message["store"], message["job"], message.get("env") or {})
            self.children.add(pid)
            return {"ok": True, "pid": pid}
        raise ValueError(f"unknown op {op!r}")


def _run_forked_supervisor(store_root: str, job_id: str, env: dict[str, str]) -> None:
    """In the fork: become the job's supervisor, then exit without running any of the
    zygote's exit handlers."""
    global _IN_ZYGOTE_CHILD
    status = 1
    try:
        gc.freeze()  # what the zygote had is not ours to collect (see Zygote.preload)
        _IN_ZYGOTE_CHILD = True
        os.setsid()
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD):
            signal.signal(signum, signal.SIG_DFL)
        os.environ.clear()
        os.environ.update(env)
        os.environ["MLCLUSTER_STORE_DIR"] = store_root
        log_path = os.path.join(store_root, "jobs", job_id, "supervisor.log")
        fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.closerange(3, _max_fd())
        _fresh_stdio()
        from .supervisor import main as supervisor_main

        status = supervisor_main([store_root, job_id])
    except BaseException:  # noqa: BLE001
        import traceback

        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(status)


def become_rank(env: dict[str, str], cwd: str | None, payload_path: str) -> int:
    """In a fork of a warm supervisor: turn into a rank exactly like a cold one."""
    from ..runtime import worker
    from ..runtime.payload import Payload, read_payload_bytes

    gc.freeze()  # inherited objects: never scanned, never copied by the collector
    for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD):
        signal.signal(signum, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    control_fd = int(env["MLCLUSTER_REPORT"].split(":", 1)[1])
    os.closerange(3, control_fd)
    os.closerange(control_fd + 1, _max_fd())
    os.environ.clear()
    os.environ.update(env)  # CUDA_VISIBLE_DEVICES among them, before anything touches CUDA
    worker.complete_environment(os.environ)
    if cwd and os.path.isdir(cwd):
        os.chdir(cwd)
    _fresh_stdio()
    _reseed_and_rethread()
    import jupyterlab_mlcluster.runtime.reporting as reporting

    reporting.configure()  # this rank's channel, rank and job key
    worker.tie_to_supervisor()
    payload = Payload.loads(read_payload_bytes(payload_path))
    return worker.execute(payload)


def _fresh_stdio() -> None:
    """New sys.stdout/err on fds 1/2, line-buffered like a PYTHONUNBUFFERED process."""
    sys.stdout = io.TextIOWrapper(
        io.FileIO(1, "w", closefd=False), line_buffering=True, write_through=True
    )
    sys.stderr = io.TextIOWrapper(
        io.FileIO(2, "w", closefd=False),
        line_buffering=True,
        write_through=True,
        errors="backslashreplace",
    )
    sys.__stdout__, sys.__stderr__ = sys.stdout, sys.stderr
    sys.stdin = open(os.devnull)  # noqa: SIM115
    sys.__stdin__ = sys.stdin


def _reseed_and_rethread() -> None:
    """A fork shares the parent's RNG states and thread settings; a fresh interpreter
    would not. Give the rank its own seeds and the thread count its env asks for."""
    import random

    random.seed()
    # numpy's global generator only exists once numpy.random is imported; a later import
    # in the rank seeds itself from the OS.
    numpy_random = sys.modules.get("numpy.random")
    if numpy_random is not None:
        numpy_random.seed(int.from_bytes(os.urandom(4), "little"))
    torch = sys.modules.get("torch")
    if torch is not None:
        # The CPU generator only: a fresh interpreter seeds it at random, and CUDA generators
        # do not exist yet (the zygote never touched CUDA), so they start as in a fresh one.
        # (torch.seed() would also import and seed every accelerator module: ~2.5 ms a rank.)
        torch.default_generator.seed()
        threads = os.environ.get("OMP_NUM_THREADS")
        if threads and threads.isdigit():
            torch.set_num_threads(int(threads))


def _max_fd() -> int:
    try:
        return min(os.sysconf("SC_OPEN_MAX"), 65536)
    except (ValueError, OSError):
        return 4096


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    path, modules, idle, fp = (
        Path(argv[0]),
        [m for m in argv[1].split(",") if m],
        float(argv[2]),
        argv[3],
    )
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    zygote = Zygote(path, modules, idle, fp)
    zygote.preload()
    zygote.serve()
    return 0


if __name__ == "__main__":
    # Run the package's copy of this module, not __main__'s: the fork's flags must be set
    # where the rest of the package reads them.
    from jupyterlab_mlcluster.jobs import warmpool as _warmpool

    sys.exit(_warmpool.main())
