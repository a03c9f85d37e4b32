"""The zygote: a single-threaded, CUDA-clean process that preloads a generation's modules
(proving each package fork-safe) and serves its socket; each spawn_supervisor forks the
job's supervisor, which forks the warm ranks (rank.py). Run as
`python -m jupyterlab_mlcluster.jobs.warm.zygote` (client.ensure_zygote)."""

from __future__ import annotations

import contextlib
import gc
import importlib
import json
import os
import selectors
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

from . import fresh
from .client import REQUEST_TIMEOUT, _record_refusal, refused_modules
from .environment import (
    _IMPORT_READS,
    _START_ENV,
    OVERLAY_VARIABLE,
    _differing,
    _RecordEnvironReads,
    _watched_names,
)
from .place import env_fingerprint, peer_uid
from .rank import _fresh_stdio, _max_fd

_IN_ZYGOTE_CHILD = False
_OWN_MODULES = (
    "jupyterlab_mlcluster.jobs.running.supervisor",
    "jupyterlab_mlcluster.backends.local.backend",
    "jupyterlab_mlcluster.runtime.worker",
    "jupyterlab_mlcluster.config",
    "jupyter_core.paths",
    "cloudpickle",
    "psutil",
)
SELF_CHECK_INTERVAL = 5.0
# In a forked supervisor: what the submitter did about a job it could not serve warm (a
# generation with the job's values being prepared, or why not); its cold-start note says it.
_PREPARING: str | None = None


def preparing_note() -> str | None:
    """In a forked supervisor: what the pool does for jobs with this job's values (None:
    nothing was asked)."""
    return _PREPARING


def in_zygote_child() -> bool:
    """True in a supervisor forked from the zygote: it may fork warm ranks."""
    return _IN_ZYGOTE_CHILD


class Zygote:
    def __init__(
        self,
        path: Path,
        modules: list[str],
        idle_timeout: float,
        fp: str,
        env_fp: str = "",
        overlay: dict[str, str | None] | None = None,
    ):
        self.path = path
        self.overlay = overlay or {}  # an env-keyed generation's key (OVERLAY_VARIABLE)
        self.modules = modules  # as requested: what this generation is for
        self.wanted = set(modules)
        self.tops = sorted({m.partition(".")[0] for m in modules})
        self.idle_timeout = idle_timeout
        self.fp = fp
        self.env_fp = env_fp
        self.imported: list[str] = []  # top-level packages actually preloaded
        self.children: set[int] = set()
        self.last_used = time.monotonic()
        self.running = True
        self.started = time.time()
        self.inode: int | None = None  # of the socket file this zygote listens through

    def preload(self) -> None:
        """Import our own modules, then the requested ones package by package, proving each
        package safe: after it, CUDA must still be uninitialised and no Python thread may
        have started. A package that fails is refused for good (refused.json, one line in
        our log) and the zygote starts over without it: what it did cannot be undone here."""
        for name in _OWN_MODULES:  # what every supervisor and rank needs anyway
            importlib.import_module(name)
        _START_ENV.update(os.environ)
        refused = set(refused_modules(self.path.parent)) | set(
            filter(None, os.environ.get("MLCLUSTER_ZYGOTE_REFUSED", "").split(","))
        )
        groups: dict[str, list[str]] = {}
        for name in self.modules:
            groups.setdefault(name.partition(".")[0], []).append(name)
        per_rank: dict[str, str] = {}  # package -> why each rank imports it itself
        for top, names in groups.items():
            if top in refused:
                continue
            rank_reads: dict[str, set[str]] = {}
            for name in names:
                try:
                    with _RecordEnvironReads(_IMPORT_READS, rank_reads):
                        importlib.import_module(name)
                except (Exception, SystemExit):  # noqa: BLE001 - not installed, or broken
                    continue
            problem = self.fork_problem()
            if problem is not None:
                self._refuse(top, problem, refused)
            per_rank.update(_read_per_rank(top, rank_reads))
            if top in sys.modules:
                self.imported.append(top)
        if per_rank:
            self._leave_to_ranks(per_rank, refused)
        fresh.remember()  # what each rank goes back to (jobs/warm/fresh.py)
        # Everything imported so far lives as long as we do. Frozen objects are never
        # scanned by the collector, so no fork pays for a full collection of torch's heap
        # (~150 ms here) nor copies every page it would touch doing so.
        gc.collect()
        gc.freeze()

    def _refuse(self, top: str, problem: str, refused: set[str]) -> None:
        reason = f"{problem} on import"
        print(f"warm pool: {top} dropped from the preload list: {reason}", flush=True)
        with contextlib.suppress(OSError):
            _record_refusal(self.path.parent, top, reason)
        self._start_over(refused | {top})

    @staticmethod
    def _start_over(without: set[str]) -> None:
        # Start over, same pid and arguments, without them (the variable keeps us from
        # looping when the record could not be written).
        env = dict(os.environ, MLCLUSTER_ZYGOTE_REFUSED=",".join(sorted(without)))
        argv = [sys.executable, "-m", "jupyterlab_mlcluster.jobs.warm.zygote", *sys.argv[1:]]
        os.execve(sys.executable, argv, env)

    def _leave_to_ranks(self, per_rank: dict[str, str], refused: set[str]) -> None:
        """Packages whose import read a variable of the rank table hold this zygote's value
        of it (unset), where a fresh rank would hold its own: each rank must import them
        itself, after its environment is set. Recorded like a refusal (the pool never asks
        for them again) and, as for one, the zygote starts over without them; the rest of
        the generation stays warm."""
        for top, reason in sorted(per_rank.items()):
            print(f"warm pool: {top} dropped from the preload list: {reason}", flush=True)
            with contextlib.suppress(OSError):
                _record_refusal(self.path.parent, top, reason)
        self._start_over(refused | set(per_rank))

    def fork_problem(self) -> str | None:
        """Why forking now would be unsafe (None: it is safe)."""
        if self.cuda_initialized():
            return "it initialised CUDA"
        if self.thread_count() != 1:
            others = [t.name for t in threading.enumerate() if t is not threading.main_thread()]
            return f"it started a thread ({', '.join(others)})"
        return None

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
        self.inode = os.stat(self.path).st_ino
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
                    if not self._at_its_path():
                        # Another start of this generation put its socket where ours was
                        # (or ours was removed): nobody can reach us any more. Leave now,
                        # not after the idle timeout.
                        break
                    if env_fingerprint() != self.env_fp:  # packages changed under us
                        break
        finally:
            if self._at_its_path():  # never another generation's socket
                with contextlib.suppress(FileNotFoundError):
                    self.path.unlink()
            listener.close()

    def _at_its_path(self) -> bool:
        """The socket at this generation's path is still the one this zygote listens on."""
        try:
            return os.stat(self.path).st_ino == self.inode
        except OSError:
            return False

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
            reply = {
                "ok": True,
                "pid": os.getpid(),
                "fingerprint": self.fp,
                "env": self.env_fp,
                "executable": os.path.realpath(sys.executable),
                "started": self.started,
                "size": len(self.wanted),
                "tops": self.tops,
                "overlay": self.overlay,
            }
            env = message.get("env")
            if isinstance(env, dict):
                # Which variables a job's ranks with this environment would see stale here
                # (name -> the job's value): it decides whether this generation fits the job.
                reply["stale"] = {name: env.get(name) for name in _differing(env)}
            want = message.get("want")
            if isinstance(want, list):
                # Against what we really have (pinned imports' own too), less what we were
                # built for but could not import (a kernel's aliases, broken modules):
                # another generation could not do better.
                reply["missing"] = sum(
                    1 for m in want if m not in sys.modules and m not in self.wanted
                )
            return reply
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
                "pss_bytes": getattr(mem, "pss", None),
                "uss_bytes": getattr(mem, "uss", None),
                "children": len(self.children),
                "uptime": time.time() - self.started,
                "idle": time.monotonic() - self.last_used,
            }
        if op == "stop":
            self.running = False
            return {"ok": True}
        if op == "spawn_supervisor":
            self.last_used = time.monotonic()
            problem = self.fork_problem()  # proven before every fork, never assumed
            if problem is not None:
                self.running = False  # this generation can never be safe again: retire
                raise RuntimeError(f"zygote is no longer fork-safe: {problem}")
            pid = os.fork()
            if pid == 0:
                _run_forked_supervisor(
                    message["store"],
                    message["job"],
                    message.get("env") or {},
                    message.get("preparing"),
                )
            self.children.add(pid)
            return {"ok": True, "pid": pid, "watched": _watched_names()}
        raise ValueError(f"unknown op {op!r}")


def _read_per_rank(top: str, rank_reads: dict[str, set[str]]) -> dict[str, str]:
    """The packages that importing `top` showed to read the rank table (`top` itself, and
    the package of each module that read it), each with why, for the pool's log."""
    readers: dict[str, set[str]] = {}
    for variable, modules in rank_reads.items():
        for module in modules:
            readers.setdefault(module, set()).add(variable)
    found: dict[str, str] = {}
    for module, variables in sorted(readers.items()):
        why = (
            f"{module} reads {', '.join(sorted(variables))} at import: "
            "each rank imports it itself, with its own values"
        )
        package = module.partition(".")[0]
        found.setdefault(top, why)
        if (
            package.isidentifier()
            and not package.startswith("_")  # (__main__: the read came from no import)
            and package not in sys.stdlib_module_names
        ):
            found.setdefault(package, why)
    return found


def _run_forked_supervisor(
    store_root: str, job_id: str, env: dict[str, str], preparing: str | None = None
) -> None:
    """In the fork: become the job's supervisor, then exit without running any of the
    zygote's exit handlers. `preparing`: what the submitter did for a job no generation
    fits (said in the job's log if its ranks start cold)."""
    global _IN_ZYGOTE_CHILD, _PREPARING
    status = 1
    try:
        gc.freeze()  # what the zygote had is not ours to collect (see Zygote.preload)
        _IN_ZYGOTE_CHILD = True
        _PREPARING = preparing if isinstance(preparing, str) else None
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
        from ..running.supervisor import main as supervisor_main

        status = supervisor_main([store_root, job_id])
    except BaseException:  # noqa: BLE001
        import traceback

        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(status)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    path, modules_arg, idle, fp = Path(argv[0]), argv[1], float(argv[2]), argv[3]
    env_fp = argv[4] if len(argv) > 4 else env_fingerprint()
    if modules_arg.startswith("@"):  # a list written by ensure_zygote (argv has a size limit)
        fd = os.open(modules_arg[1:], os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        with os.fdopen(fd) as f:
            modules = [m for m in json.load(f) if isinstance(m, str) and m]
    else:
        modules = [m for m in modules_arg.split(",") if m]
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    overlay: dict[str, str | None] = {}
    with contextlib.suppress(ValueError, TypeError):
        # (kept in our environment: a re-execution without a refused package needs it too)
        loaded = json.loads(os.environ.get(OVERLAY_VARIABLE) or "{}")
        overlay = {str(k): v for k, v in dict(loaded).items() if v is None or isinstance(v, str)}
    zygote = Zygote(path, modules, idle, fp, env_fp, overlay)
    zygote.preload()
    zygote.serve()
    return 0


if __name__ == "__main__":
    # The zygote is a program of its own: its entry fills the backend registry for the
    # supervisors it forks, as a front end does (allowed by name in pyproject.toml's import
    # contracts).
    import jupyterlab_mlcluster.backends  # noqa: F401

    # Run the package's copy of this module, not __main__'s: the fork's flags must be set
    # where the rest of the package reads them.
    from jupyterlab_mlcluster.jobs.warm import zygote as _zygote

    sys.exit(_zygote.main())
