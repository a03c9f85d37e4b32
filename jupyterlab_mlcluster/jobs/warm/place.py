"""The pool's place and identity: the directory its sockets live in (this user's own,
checked before every use), a generation's fingerprint and its socket's path."""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import socket
import stat
import struct
import sys
import tempfile
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..._version import __version__

_ENV_KEYS = (
    "PYTHONPATH",
    "PYTHONHOME",
    "LD_LIBRARY_PATH",
    "VIRTUAL_ENV",
    "CONDA_PREFIX",
    "CUDA_HOME",
)


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
