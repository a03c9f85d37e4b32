"""Talking to the pool's zygotes: one request, starting a generation, the generations
that answer, what they refused, their memory, status and stop."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import stat
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...runtime.atomic import write_whole
from ..running.processes import start_detached
from .environment import OVERLAY_VARIABLE
from .place import (
    UnsafePoolDir,
    _open_private,
    _warn_once,
    env_fingerprint,
    fingerprint,
    peer_uid,
    pool_dir,
    socket_path,
)

if TYPE_CHECKING:
    from ...config import MLClusterConfig

START_TIMEOUT = 60.0
REQUEST_TIMEOUT = 10.0


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


def requested_modules(
    config: MLClusterConfig, learned: list[str] | tuple[str, ...] = ()
) -> list[str]:
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
    """Add one refusal to refused.json: locked (read, add, write), written whole, never half."""
    lock_fd = _open_private(directory / "refused.lock", os.O_WRONLY)
    with os.fdopen(lock_fd, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        refused = refused_modules(directory)
        refused[name] = reason
        write_whole(directory / "refused.json", json.dumps(refused))


def ensure_zygote(
    config: MLClusterConfig,
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
                    "jupyterlab_mlcluster.jobs.warm.zygote",
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


def building_pid(directory: Path, fp: str) -> int | None:
    """The pid of this generation's zygote as its pid file names it, while that process is
    this user's zygote of this generation (started, perhaps still importing); else None."""
    import psutil

    try:
        fd = os.open(directory / f"zygote-{fp}.pid", os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        with os.fdopen(fd) as f:
            pid = int(f.read(32))
        proc = psutil.Process(pid)
        if proc.uids().real == os.getuid() and fp in proc.cmdline():
            return pid
    except (OSError, ValueError, psutil.Error):
        pass
    return None


def _building(directory: Path, fp: str) -> bool:
    """A zygote for this generation is still importing (started, not yet listening)."""
    return building_pid(directory, fp) is not None


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


def pool_status(config: MLClusterConfig) -> dict[str, Any]:
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


def status(config: MLClusterConfig) -> dict[str, Any] | None:
    """The newest generation of this environment (its status op), or None."""
    try:
        env_fp = env_fingerprint()
        current = [g for g in _generations() if g.get("env") == env_fp]
        if not current:
            return None
        return request(Path(current[-1]["socket"]), {"op": "status"}, timeout=2.0)
    except (OSError, ValueError, RuntimeError):  # UnsafePoolDir among them
        return None


def stop(config: MLClusterConfig) -> bool:
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
