"""The child side: a fork of a warm supervisor turns into a rank exactly like a cold one
(its own environment, cwd, stdio, seeds, thread count; inherited teardown skipped)."""

from __future__ import annotations

import contextlib
import gc
import io
import os
import sys

from . import fresh


def become_rank(env: dict[str, str], cwd: str | None, payload_path: str) -> int:
    """In a fork of a warm supervisor: turn into a rank exactly like a cold one."""
    from ...runtime import worker
    from ...runtime.payload import Payload, read_payload_bytes

    gc.freeze()  # inherited objects: never scanned, never copied by the collector
    fresh.reset_signals()
    control_fd = int(env["MLCLUSTER_REPORT"].split(":", 1)[1])
    fresh.shed_logging((control_fd,))  # while its files' descriptors are still theirs
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
    fresh.shed_modules()  # (what this function needed is imported by now)
    if env.get("MLCLUSTER_SESSION"):  # a session's rank: cells come on its stdin
        from ...runtime import session_worker

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
    sys.stdin = open(os.devnull)
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
