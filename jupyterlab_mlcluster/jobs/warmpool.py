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
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from .._version import __version__
from .running.processes import start_detached

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
    "jupyterlab_mlcluster.jobs.running.supervisor",
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


# -- what a warm rank cannot see differently ------------------------------------------------
#
# A warm rank inherits everything the zygote's imports did with the environment the zygote
# had. A fresh interpreter would have done it with the rank's own. So the zygote records what
# its preloaded modules read (`os.environ[...]`, `.get`, `os.getenv`, `in`; name -> value, None
# for unset) and the environment it started with; a job whose ranks' environment differs in
# any of those, or in a variable the interpreter or a native library reads at start (below),
# cannot be served warm: it starts cold, and its log says once which variable and why. The
# submitter then prepares a generation started with the job's values (_prepare_for), so that
# the next job with them is served warm: each zygote tells a ping which variables a job's
# environment would see stale in it, and only a generation that fits serves.

# Read by the interpreter itself at start-up (PYTHONHASHSEED, PYTHONWARNINGS, PYTHONUTF8...),
# or by native code when its library loads (C getenv: never seen by os.environ): a warm rank
# cannot honour a different value.
STARTUP_PREFIXES = ("PYTHON", "OPENBLAS_", "MKL_", "KMP_", "GOMP_", "GLOG_", "LD_")
STARTUP_NAMES = frozenset({"TORCH_CPP_LOG_LEVEL", "TORCH_SHOW_CPP_STACKTRACES", "MALLOC_ARENA_MAX"})
# What a warm rank does apply again itself (become_rank): stdio is made unbuffered,
# bytecode writing follows the variable, torch's thread count and c10d debug level are
# set from the rank's environment. PYTHONPATH is part of the pool's fingerprint, and each
# payload sets sys.path as a fresh interpreter would.
REAPPLIED = frozenset(
    {
        "PYTHONUNBUFFERED",
        "PYTHONDONTWRITEBYTECODE",
        "PYTHONPATH",
        "OMP_NUM_THREADS",
        "TORCH_DISTRIBUTED_DEBUG",
    }
)
# The zygote's record: what its preloaded imports read, and the environment it started with.
_IMPORT_READS: dict[str, str | None] = {}
_START_ENV: dict[str, str] = {}
# A generation keyed by a job's values (an env-keyed generation): the zygote was started
# with them (start-up ones in its process environment, so the interpreter and native
# libraries honour them; import-read ones there too, so its preloads read them). This
# variable tells it its key (JSON: name -> value, null for unset) to report in its ping.
OVERLAY_VARIABLE = "MLCLUSTER_ZYGOTE_OVERLAY"
# In a forked supervisor: what the submitter did about a job it could not serve warm (a
# generation with the job's values being prepared, or why not); its cold-start note says it.
_PREPARING: str | None = None


def preparing_note() -> str | None:
    """In a forked supervisor: what the pool does for jobs with this job's values (None:
    nothing was asked)."""
    return _PREPARING


def _read_at_startup(name: str) -> bool:
    return (name.startswith(STARTUP_PREFIXES) or name in STARTUP_NAMES) and name not in REAPPLIED


def _differing(env: Mapping[str, str]) -> dict[str, str | None]:
    """name -> this warm process's value, for each variable a warm rank with `env` would
    see stale."""
    differ: dict[str, str | None] = {}
    for name, seen in _IMPORT_READS.items():
        if name not in REAPPLIED and env.get(name) != seen:
            differ[name] = seen
    for name in set(env) | set(_START_ENV):
        if _read_at_startup(name) and env.get(name) != _START_ENV.get(name):
            differ[name] = _START_ENV.get(name)
    return differ


def _watched_names() -> list[str]:
    """The variables this warm process's fit for a job depends on (besides the job's own
    start-up ones): what its imports read, and the start-up ones it started with."""
    reads = {name for name in _IMPORT_READS if name not in REAPPLIED}
    return sorted(reads | {name for name in _START_ENV if _read_at_startup(name)})


def _fit_key(env: Mapping[str, str], watched: list[str]) -> frozenset[tuple[str, str | None]]:
    """What of `env` decides whether a generation watching `watched` fits it."""
    return frozenset(
        [(name, env.get(name)) for name in watched]
        + [(name, value) for name, value in env.items() if _read_at_startup(name)]
    )


def stale_variables(env: dict[str, str]) -> list[str]:
    """The variables whose value in `env` (a rank's) differs from what this warm process
    imported with: each as 'NAME=value (the pool's: other)'. Empty: a warm rank sees
    what a fresh interpreter with `env` would."""
    differ = _differing(env)
    return [
        f"{name}={_shown(env.get(name))} (the warm pool's: {_shown(seen)})"
        for name, seen in sorted(differ.items())
    ]


def _shown(value: str | None) -> str:
    if value is None:
        return "unset"
    return repr(value) if len(value) <= 60 else repr(value[:57] + "...")


class _RecordEnvironReads:
    """While active, every read of one variable through os.environ (`[]`, `.get`, `in`,
    os.getenv) lands in `reads` with the value it found. Copies and sweeps of the whole
    environment (iteration, .items(), .copy(): what subprocess does) are not reads of a
    variable and are left out: else every job would differ in PWD or SHLVL."""

    _LIBRARY = frozenset(
        {os.__file__, "<frozen os>", "<frozen _collections_abc>"}
        | {getattr(sys.modules.get("_collections_abc"), "__file__", None) or ""}
    )

    def __init__(self, reads: dict[str, str | None]):
        self.reads = reads
        self._original: Callable[[Any, str], str] | None = None

    def __enter__(self) -> _RecordEnvironReads:
        environ_type = type(os.environ)
        original = self._original = environ_type.__getitem__
        reads, library = self.reads, self._LIBRARY

        def recording_getitem(environ, key):
            caller = sys._getframe(1)
            code = caller.f_code
            one = code.co_filename not in library or code.co_name in ("get", "__contains__")
            if one and code.co_name in ("get", "__contains__") and caller.f_back is not None:
                outer = caller.f_back.f_code
                # Mapping.get called by a sweep of the mapping (rare) is a sweep too.
                one = outer.co_filename not in library or outer.co_name == "getenv"
            try:
                value = original(environ, key)
            except KeyError:
                if one and isinstance(key, str):
                    reads.setdefault(key, None)
                raise
            if one and isinstance(key, str):
                reads.setdefault(key, value)
            return value

        # Patching the class's method is the point: every read through os.environ is seen.
        environ_type.__getitem__ = recording_getitem  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: Any) -> None:
        type(os.environ).__getitem__ = self._original  # type: ignore[method-assign,assignment]


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
    problems: list[str] = []
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


def env_fingerprint(env: Mapping[str, str] | None = None) -> str:
    """What a warm interpreter's imports depend on (interpreter, import-relevant variables,
    installed packages); any change retires every generation built on it."""
    env = os.environ if env is None else env
    parts: list[Any] = [os.path.realpath(sys.executable), sys.version, __version__]
    parts += [(k, env.get(k, "")) for k in _ENV_KEYS]
    # `pip install` (also `--target` into a PYTHONPATH entry) changes the directory's mtime.
    for d in _site_dirs() + _pythonpath(env):
        try:
            parts.append((d, os.stat(d).st_mtime_ns))
        except OSError:
            parts.append((d, None))
    return hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest()[:16]


def _pythonpath(env: Mapping[str, str]) -> list[str]:
    return [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]


def fingerprint(
    modules: list[str],
    env: dict[str, str] | None = None,
    overlay: Mapping[str, str | None] | None = None,
) -> str:
    """One generation: an environment, the modules its zygote preloads, and (an env-keyed
    generation) the variables' values it was started with."""
    parts: list[Any] = [env_fingerprint(env), sorted(set(modules))]
    if overlay:
        parts.append(sorted(overlay.items()))
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:16]


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


def requested_modules(config, learned: list[str] | tuple[str, ...] = ()) -> list[str]:
    """What a job's generation should preload: the pinned list, then (when learning is on)
    what the submitter learned, less what the pool refused before."""
    pinned = list(config.warm_pool_modules)
    if not config.warm_pool_learn:
        return pinned
    refused = refused_modules()
    wanted = pinned + [m for m in learned if m not in pinned]
    return [m for m in wanted if m.partition(".")[0] not in refused or m in pinned]


def refused_modules(directory: Path | None = None) -> dict[str, str]:
    """Packages a zygote found unsafe to preload (name -> why), from the pool directory."""
    try:
        directory = pool_dir() if directory is None else directory
        fd = os.open(directory / "refused.json", os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as f:
            data = json.loads(f.read(1 << 20))
    except (OSError, ValueError, UnsafePoolDir):
        return {}
    if not isinstance(data, dict):
        return {}
    return {k: v for k, v in data.items() if isinstance(k, str) and isinstance(v, str)}


def _record_refusal(directory: Path, name: str, reason: str) -> None:
    """Add one refusal to refused.json: locked, written whole (tmp + rename), never half."""
    lock_fd = _open_private(directory / "refused.lock", os.O_WRONLY)
    with os.fdopen(lock_fd, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        refused = refused_modules(directory)
        refused[name] = reason
        tmp = directory / f"refused.{os.getpid()}.tmp"
        with os.fdopen(_open_private(tmp, os.O_WRONLY | os.O_TRUNC), "w") as f:
            json.dump(refused, f)
        os.replace(tmp, directory / "refused.json")


def ensure_zygote(
    config,
    wait: bool = True,
    modules: list[str] | None = None,
    overlay: Mapping[str, str | None] | None = None,
) -> Path | None:
    """The socket of a ready zygote (generation) preloading `modules` (default: the pinned
    list) in this environment, starting one if none is up or being built. `overlay`: an
    env-keyed generation's variables (name -> value, None: unset), set in its environment.

    With wait=False, returns None at once when none is ready yet (it keeps starting)."""
    modules = list(config.warm_pool_modules) if modules is None else list(modules)
    env_fp = env_fingerprint()
    fp = fingerprint(modules, overlay=overlay)
    zygote_env: dict[str, str] | None = None
    if overlay:
        zygote_env = dict(os.environ)
        for name, value in overlay.items():
            if value is None:
                zygote_env.pop(name, None)
            else:
                zygote_env[name] = value
        zygote_env[OVERLAY_VARIABLE] = json.dumps(dict(overlay))
    try:
        path = socket_path(fp)
    except UnsafePoolDir as exc:
        _warn_once(str(exc))
        return None
    if _ping(path):
        return path
    lock_fd = _open_private(path.parent / f"zygote-{fp}.lock", os.O_WRONLY)
    with os.fdopen(lock_fd, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one starter per generation, across processes
        if not _ping(path) and not _building(path.parent, fp):
            _retire_other_environments(env_fp)
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            modules_file = path.parent / f"zygote-{fp}.modules"
            with os.fdopen(_open_private(modules_file, os.O_WRONLY | os.O_TRUNC), "w") as f:
                json.dump(modules, f)
            zygote_log = os.fdopen(
                _open_private(path.parent / f"zygote-{fp}.log", os.O_WRONLY | os.O_APPEND), "ab"
            )
            proc = start_detached(
                [
                    sys.executable,
                    "-m",
                    "jupyterlab_mlcluster.jobs.warmpool",
                    str(path),
                    "@" + str(modules_file),
                    str(config.warm_pool_idle_timeout),
                    fp,
                    env_fp,
                ],
                zygote_log,
                env=zygote_env,
                cwd="/",  # so a user's ./torch or ./numpy can never shadow the real ones here
            )
            with os.fdopen(
                _open_private(path.parent / f"zygote-{fp}.pid", os.O_WRONLY | os.O_TRUNC), "w"
            ) as f:
                f.write(str(proc.pid))
    if not wait:
        return None
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if _ping(path):
            return path
        time.sleep(0.05)
    return None


def _building(directory: Path, fp: str) -> bool:
    """A zygote for this generation is still importing (started, not yet listening)."""
    import psutil

    try:
        fd = os.open(directory / f"zygote-{fp}.pid", os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        with os.fdopen(fd) as f:
            pid = int(f.read(32))
        proc = psutil.Process(pid)
        return proc.uids().real == os.getuid() and fp in proc.cmdline()
    except (OSError, ValueError, psutil.Error):
        return False


def _build_underway() -> bool:
    """Some generation of this pool is still importing (started, not yet serving)."""
    directory = pool_dir()
    for pid_file in directory.glob("zygote-*.pid"):
        fp = pid_file.name[len("zygote-") : -len(".pid")]
        if _building(directory, fp) and _ping(directory / f"zygote-{fp}.sock") is None:
            return True
    return False


def _ping(
    path: Path, want: list[str] | None = None, env: Mapping[str, str] | None = None
) -> dict[str, Any] | None:
    """A ready zygote's identity (and how many of `want` it lacks; which variables a job's
    ranks with `env` would see stale in it); None if none answers."""
    if not os.path.lexists(path):
        return None
    message: dict[str, Any] = {"op": "ping"}
    if want is not None:
        message["want"] = want
    if env is not None:
        message["env"] = dict(env)
    try:
        reply = request(path, message, timeout=2.0)
    except (OSError, ValueError, RuntimeError):
        return None
    return reply if reply.get("ok") else None


def _generations(
    want: list[str] | None = None, env: Mapping[str, str] | None = None
) -> list[dict[str, Any]]:
    """Every ready zygote in the pool directory, oldest first (their pings, plus 'socket')."""
    found = []
    for sock in pool_dir().glob("zygote-*.sock"):
        info = _ping(sock, want, env)
        if info is not None:
            info["socket"] = str(sock)
            found.append(info)
    return sorted(found, key=lambda g: g.get("started", 0.0))


def _retire_other_environments(keep_env: str) -> None:
    """Ask zygotes of an outdated environment of this interpreter to exit."""
    for info in _generations():
        if info.get("env") == keep_env:
            continue
        if info.get("executable") == os.path.realpath(sys.executable):
            with contextlib.suppress(OSError, ValueError, RuntimeError):
                request(Path(info["socket"]), {"op": "stop"}, timeout=1.0)


def _memory(pid: int) -> dict[str, int | None]:
    """A zygote's memory: PSS counts shared pages pro rata, USS only its own."""
    import psutil

    try:
        mem = psutil.Process(pid).memory_full_info()
    except psutil.Error:
        return {"rss_bytes": None, "pss_bytes": None, "uss_bytes": None}
    return {
        "rss_bytes": mem.rss,
        "pss_bytes": getattr(mem, "pss", None),
        "uss_bytes": getattr(mem, "uss", None),
    }


def _stop_generation(info: dict[str, Any]) -> None:
    with contextlib.suppress(OSError, ValueError, RuntimeError):
        request(Path(info["socket"]), {"op": "stop"}, timeout=1.0)


def _within_memory(config, generations: list[dict[str, Any]], serving: dict[str, Any]) -> bool:
    """Keep the idle pool under warm_pool_max_memory: retire the oldest generations other
    than the serving one while over it. False: still over (learn no more)."""
    limit = config.warm_pool_max_memory
    if not limit:
        return True
    sizes = {g["pid"]: _memory(g["pid"])["pss_bytes"] or 0 for g in generations}
    total = sum(sizes.values())
    for old in list(generations):  # oldest first
        if total <= limit:
            break
        if old is serving:
            continue
        _stop_generation(old)
        total -= sizes[old["pid"]]
        _warn_once(
            f"warm pool: retired generation {old['fingerprint']} "
            f"({sizes[old['pid']] / 2**20:.0f} MiB) to stay under warm_pool_max_memory"
        )
        generations.remove(old)
    if total > limit:
        _warn_once(
            f"warm pool: not learning more modules: the idle pool uses {total / 2**20:.0f} MiB, "
            f"over warm_pool_max_memory ({limit / 2**20:.0f} MiB)"
        )
        return False
    return True


def serving_generation(
    config, want: list[str], env: Mapping[str, str] | None = None
) -> Path | None:
    """The socket of the generation that should fork a job wanting `want` preloaded, whose
    ranks' environment is `env` (None: any generation fits).

    Only generations that fit `env` (none of the variables they imported or started with
    differs) are candidates. One that has all of `want` serves (the smallest such), and
    generations it supersedes retire. Otherwise a generation with them is built in the
    background (memory allowing) while the nearest ready one serves; with none ready, the
    job waits for the new one (the first cell pays the preload). When generations run but
    none fits `env`, the nearest serves (its supervisor starts the ranks cold) while one
    keyed by the job's values is prepared (_prepare_for)."""
    return _serving(config, want, env)[0]


def _serving(
    config, want: list[str], env: Mapping[str, str] | None = None
) -> tuple[Path | None, bool, str | None]:
    """serving_generation(), whether the generation covers all of `want` and fits `env`,
    and (when none fits) what the pool does about it, for the job's log."""
    env_fp = env_fingerprint()
    current = [g for g in _generations(want, env) if g.get("env") == env_fp]
    generations = [g for g in current if not g.get("stale")]
    if current and not generations:
        nearest = max(current, key=lambda g: (-g.get("missing", 0), g.get("started", 0.0)))
        assert env is not None  # (without an env every generation fits)
        return Path(nearest["socket"]), False, _prepare_for(config, want, env, current, nearest)
    covering = [g for g in generations if g.get("missing") == 0]
    if covering:
        best = min(covering, key=lambda g: (g.get("size", 0), -g.get("started", 0.0)))
        for other in list(generations):
            # A smaller generation of the same packages (and the same key) is never chosen
            # again: retire it.
            if (
                other is not best
                and other.get("size", 0) < best.get("size", 0)
                and set(other.get("tops", ())) <= set(best.get("tops", ()))
                and other.get("overlay") == best.get("overlay")
            ):
                _stop_generation(other)
                generations.remove(other)
                current.remove(other)
        if len(current) > 1:  # (one alone is never retired: no need to measure it)
            _within_memory(config, current, best)
        return Path(best["socket"]), True, None
    if not generations:  # (nor any other: the pool is not running)
        path = ensure_zygote(config, wait=True, modules=want)
        first = None if path is None or env is None else _ping(path, want, env)
        if first is not None and first.get("stale"):
            # The pool's first generation, started with the submitter's environment, does
            # not fit the job's own (--env): prepare the job's already.
            first["socket"] = str(path)
            return path, False, _prepare_for(config, want, env or {}, [first], first)
        return path, path is not None, None
    nearest = max(generations, key=lambda g: (-g.get("missing", 0), g.get("started", 0.0)))
    # One build at a time: the next cell's slightly different wish waits for this one's
    # generation (which may cover it) rather than start a second build on the same cores.
    if not _build_underway() and _within_memory(config, current, nearest):
        ensure_zygote(config, wait=False, modules=want, overlay=nearest.get("overlay"))
    return Path(nearest["socket"]), False, None


def _prepare_for(
    config,
    want: list[str],
    env: Mapping[str, str],
    generations: list[dict[str, Any]],
    nearest: dict[str, Any],
) -> str:
    """No running generation fits a job's environment `env`: start (in the background) one
    keyed by the job's values of the variables that differ, so that the next job with them
    is served warm. Within warm_pool_max_memory, one build at a time, and at most
    warm_pool_max_env_generations generations keyed by values other than the pool's
    environment's. What was done, for the job's log."""
    overlay = {name: env.get(name) for name in nearest.get("stale") or ()}
    fixed = sorted(set(overlay) & set(_ENV_KEYS))
    if fixed:
        return (
            f"no generation can be prepared for it: {', '.join(fixed)} "
            "is part of the pool's own environment"
        )
    fp = fingerprint(want, overlay=overlay)
    directory = pool_dir()
    if _building(directory, fp):
        return "a generation of the warm pool with its values is being prepared"
    keyed = [g for g in generations if g.get("overlay")]
    cap = config.warm_pool_max_env_generations
    if len(keyed) >= cap:
        return (
            f"no generation is prepared for its values: {len(keyed)} generation(s) keyed by "
            f"other values already run (warm_pool_max_env_generations = {cap})"
        )
    if _build_underway():
        return "no generation is prepared for its values yet: another one is being built"
    if not _within_memory(config, generations, nearest):
        return "no generation is prepared for its values: no room under warm_pool_max_memory"
    ensure_zygote(config, wait=False, modules=want, overlay=overlay)
    return (
        "a generation of the warm pool with its values is being prepared: "
        "the next job with them starts warm"
    )


def learn_ahead(config, learned: list[str]) -> bool:
    """What a kernel just imported (after a cell, before any job asks): where the pool is
    running and no generation of it covers the wish, build one in the background now, so
    that the next %%distributed cell finds it ready instead of paying the imports in every
    rank. Never starts a pool that is not running (a kernel that never submits costs
    nothing); one build at a time; within warm_pool_max_memory. True if a build started.
    Only generations that fit the kernel's environment count (and the new one is keyed as
    the nearest of them); with none, the next job prepares one."""
    want = requested_modules(config, learned)
    try:
        env_fp = env_fingerprint()
        current = [g for g in _generations(want, os.environ) if g.get("env") == env_fp]
    except UnsafePoolDir:
        return False
    generations = [g for g in current if not g.get("stale")]
    if not generations or any(g.get("missing") == 0 for g in generations):
        return False
    if _build_underway():
        return False
    nearest = max(generations, key=lambda g: (-g.get("missing", 0), g.get("started", 0.0)))
    if not _within_memory(config, current, nearest):
        return False
    ensure_zygote(config, wait=False, modules=want, overlay=nearest.get("overlay"))
    return True


# This process's last choice: (environment, pool, wish) -> the generation that covered it
# and fitted the job's environment (with the variables that fit depends on, and their
# values). A kernel's next cell nearly always wishes the same, and choosing again asks every
# generation (each decoding the whole wish: ~2,600 names for a transformers kernel) on the
# job's critical path. The choice is made afresh once the wish, the environment or one of
# those variables changes, or that generation no longer answers (idle timeout, retired,
# stopped).
_Choice = tuple[tuple[str, str, frozenset[str]], Path, list[str], frozenset[Any]]
_last_choice: _Choice | None = None


def spawn_supervisor(
    config,
    store_root: str,
    job_id: str,
    learned: list[str] | tuple[str, ...] = (),
    job_env: Mapping[str, str] | None = None,
) -> bool:
    """Fork the job's supervisor from the zygote. False: use a cold start instead.

    `learned`: modules the submitter imports (a kernel's, a script's top imports) that
    jobs/preload.py found preloadable. `job_env`: what the job's ranks' environment will be
    (the submitter's and the job's --env): the generation chosen must fit it, and when none
    does, one keyed by its values is prepared (None: any generation fits)."""
    global _last_choice
    want = requested_modules(config, learned)
    message: dict[str, Any] = {
        "op": "spawn_supervisor",
        "store": store_root,
        "job": job_id,
        "env": dict(os.environ),
    }
    try:
        key = (env_fingerprint(), str(pool_dir()), frozenset(want))
        if (
            _last_choice is not None
            and _last_choice[0] == key
            and (job_env is None or _fit_key(job_env, _last_choice[2]) == _last_choice[3])
        ):
            try:
                request(_last_choice[1], message)
                return True
            except (OSError, ValueError, RuntimeError):
                _last_choice = None  # gone or retired: choose again
        path, covers, note = _serving(config, want, job_env)
    except UnsafePoolDir as exc:
        _warn_once(str(exc))
        return False
    if path is None:
        return False
    if note is not None:
        message["preparing"] = note
    try:
        reply = request(path, message)
    except (OSError, ValueError, RuntimeError):
        return False
    watched = [n for n in reply.get("watched") or () if isinstance(n, str)]
    _last_choice = None
    if covers and job_env is not None:
        _last_choice = (key, path, watched, _fit_key(job_env, watched))
    elif covers:
        _last_choice = (key, path, watched, frozenset())
    return True


def pool_status(config) -> dict[str, Any]:
    """Every generation of the idle pool with its memory, the bound, and the refusals."""
    try:
        generations = _generations()
    except UnsafePoolDir:
        generations = []
    env_fp = env_fingerprint()
    for g in list(generations):
        try:  # asked of the zygote itself: what it imported, CUDA, threads, memory
            g.update(request(Path(g["socket"]), {"op": "status"}, timeout=2.0))
        except (OSError, ValueError, RuntimeError):
            generations.remove(g)  # gone meanwhile
            continue
        g["current"] = g.get("env") == env_fp
    return {
        "generations": generations,
        "pss_bytes": sum(g["pss_bytes"] or 0 for g in generations),
        "max_memory": config.warm_pool_max_memory,
        "refused": refused_modules(),
    }


def status(config) -> dict[str, Any] | None:
    """The newest generation of this environment (its status op), or None."""
    try:
        env_fp = env_fingerprint()
        current = [g for g in _generations() if g.get("env") == env_fp]
        if not current:
            return None
        return request(Path(current[-1]["socket"]), {"op": "status"}, timeout=2.0)
    except (OSError, ValueError, RuntimeError):  # UnsafePoolDir among them
        return None


def stop(config) -> bool:
    """Stop every generation in the pool directory. False: none was running."""
    try:
        generations = _generations()
    except UnsafePoolDir:
        return False
    for g in generations:
        _stop_generation(g)
    # Wait (bounded) until they are gone: a stopped zygote that still lives counts as its
    # generation "building", so a start right after a stop would wait for it (up to
    # START_TIMEOUT) instead of starting a new one.
    import psutil

    deadline = time.monotonic() + 5.0
    for g in generations:
        while psutil.pid_exists(g["pid"]) and time.monotonic() < deadline:
            time.sleep(0.02)
    return bool(generations)


# -- the zygote -------------------------------------------------------------------------------


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
        for top, names in groups.items():
            if top in refused:
                continue
            for name in names:
                try:
                    with _RecordEnvironReads(_IMPORT_READS):
                        importlib.import_module(name)
                except (Exception, SystemExit):  # noqa: BLE001, S112 - not installed, or broken
                    continue
            problem = self.fork_problem()
            if problem is not None:
                self._refuse(top, problem, refused)
            if top in sys.modules:
                self.imported.append(top)
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
        # Start over, same pid and arguments, without it (the variable keeps us from
        # looping when the record could not be written).
        env = dict(os.environ, MLCLUSTER_ZYGOTE_REFUSED=",".join(sorted(refused | {top})))
        argv = [sys.executable, "-m", "jupyterlab_mlcluster.jobs.warmpool", *sys.argv[1:]]
        os.execve(sys.executable, argv, env)

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
                    if env_fingerprint() != self.env_fp:  # packages changed under us
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
        from .running.supervisor import main as supervisor_main

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
    _reapply_environment()
    _skip_inherited_teardown()
    import jupyterlab_mlcluster.runtime.reporting as reporting

    reporting.configure()  # this rank's channel, rank and job key
    worker.tie_to_supervisor()
    if env.get("MLCLUSTER_SESSION"):  # a session's rank: cells come on its stdin
        from ..runtime import session_worker

        return session_worker.serve()
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
    # The originals too (typeshed calls them Final): the forked child has fds of its own.
    sys.__stdout__, sys.__stderr__ = sys.stdout, sys.stderr  # type: ignore[misc]
    sys.stdin = open(os.devnull)  # noqa: SIM115
    sys.__stdin__ = sys.stdin  # type: ignore[misc]


# Exit-time finalizers the zygote's preload registered that only tear down state inside the
# process (no file, socket or child is touched): torch.library deregisters each of its ~130
# operator libraries from the dispatcher. A fresh interpreter runs them in ~7 ms; a warm rank
# would run them over the zygote's copy-on-write pages: 100-170 ms per rank at exit (measured,
# 2 cores), longer than the whole start. Their result dies with the process either way, so warm
# ranks skip the inherited ones; a Library the user's code makes is still finalized.
_INHERITED_TEARDOWN = frozenset({("torch.library", "_del_library")})


def _skip_inherited_teardown() -> None:
    import weakref

    for info in list(weakref.finalize._registry.values()):  # type: ignore[attr-defined]
        func = info.func
        if (
            getattr(func, "__module__", None),
            getattr(func, "__name__", None),
        ) in _INHERITED_TEARDOWN:
            info.atexit = False


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


def _reapply_environment() -> None:
    """What a fresh interpreter takes from variables that a warm one can still apply (the
    REAPPLIED list): bytecode writing, and torch.distributed's debug level (c10d reads
    TORCH_DISTRIBUTED_DEBUG in C++ when it loads; the zygote loaded it with its own)."""
    sys.dont_write_bytecode = bool(os.environ.get("PYTHONDONTWRITEBYTECODE"))
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available():
        with contextlib.suppress(Exception):  # an unknown level: torch raises on first use
            dist.set_debug_level_from_env()


def _max_fd() -> int:
    try:
        return min(os.sysconf("SC_OPEN_MAX"), 65536)
    except (ValueError, OSError):
        return 4096


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
    from jupyterlab_mlcluster.jobs import warmpool as _warmpool

    sys.exit(_warmpool.main())
