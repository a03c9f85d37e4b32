"""What a warm rank cannot see differently from a fresh interpreter: the variables the
interpreter and native libraries read at start, what the zygote's preloads read at import
(recorded while they import), and which of them a job's environment would see stale."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping
from typing import Any

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
# Set by the launcher for each rank (launcher.rank_environment, worker.complete_environment):
# their values differ between the ranks of a job, or between jobs, so no generation can be
# keyed by them. A module that reads one at import is never preloaded (zygote.py): each rank
# imports it itself, after its own environment is set.
RANK_TABLE = frozenset(
    {
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
        "GROUP_RANK",
        "GROUP_WORLD_SIZE",
        "ROLE_NAME",
        "ROLE_RANK",
        "ROLE_WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING",
        "CUDA_DEVICE_ORDER",
        "CUDA_VISIBLE_DEVICES",
        "TF_CONFIG",
        "JAX_COORDINATOR_ADDRESS",
        "JAX_NUM_PROCESSES",
        "JAX_PROCESS_ID",
        "JOB_COMPLETION_INDEX",
    }
)
RANK_TABLE_PREFIXES = ("TORCHELASTIC_",)
# Ours (and what the launchers we stand in for set for their workers): never a generation's key.
OWN_PREFIXES = ("MLCLUSTER_",)
OWN_NAMES = frozenset({"PYTORCH_NVML_BASED_CUDA_CHECK"})


def in_rank_table(name: str) -> bool:
    return name in RANK_TABLE or name.startswith(RANK_TABLE_PREFIXES)


def _never_keys(name: str) -> bool:
    return (
        name in REAPPLIED
        or in_rank_table(name)
        or name in OWN_NAMES
        or name.startswith(OWN_PREFIXES)
    )


# The zygote's record: what its preloaded imports read, and the environment it started with.
_IMPORT_READS: dict[str, str | None] = {}
_START_ENV: dict[str, str] = {}
# A generation keyed by a job's values (an env-keyed generation): the zygote was started
# with them (start-up ones in its process environment, so the interpreter and native
# libraries honour them; import-read ones there too, so its preloads read them). This
# variable tells it its key (JSON: name -> value, null for unset) to report in its ping.
OVERLAY_VARIABLE = "MLCLUSTER_ZYGOTE_OVERLAY"


def _read_at_startup(name: str) -> bool:
    return (name.startswith(STARTUP_PREFIXES) or name in STARTUP_NAMES) and not _never_keys(name)


def _differing(env: Mapping[str, str]) -> dict[str, str | None]:
    """name -> this warm process's value, for each variable a warm rank with `env` would
    see stale."""
    differ: dict[str, str | None] = {}
    for name, seen in _IMPORT_READS.items():
        if not _never_keys(name) and env.get(name) != seen:
            differ[name] = seen
    for name in set(env) | set(_START_ENV):
        if _read_at_startup(name) and env.get(name) != _START_ENV.get(name):
            differ[name] = _START_ENV.get(name)
    return differ


def _watched_names() -> list[str]:
    """The variables this warm process's fit for a job depends on (besides the job's own
    start-up ones): what its imports read, and the start-up ones it started with."""
    reads = {name for name in _IMPORT_READS if not _never_keys(name)}
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

    def __init__(self, reads: dict[str, str | None], rank_reads: dict[str, set[str]] | None = None):
        self.reads = reads
        # A variable of the rank table -> the modules whose import read it (see _importing).
        self.rank_reads = {} if rank_reads is None else rank_reads
        self._original: Callable[[Any, str], str] | None = None

    def __enter__(self) -> _RecordEnvironReads:
        environ_type = type(os.environ)
        original = self._original = environ_type.__getitem__
        reads, library, rank_reads = self.reads, self._LIBRARY, self.rank_reads

        def recording_getitem(environ: os._Environ[str], key: str) -> str:
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
                    if in_rank_table(key):
                        rank_reads.setdefault(key, set()).add(_importing(caller))
                raise
            if one and isinstance(key, str):
                reads.setdefault(key, value)
                if in_rank_table(key):
                    rank_reads.setdefault(key, set()).add(_importing(caller))
            return value

        # Patching the class's method is the point: every read through os.environ is seen.
        environ_type.__getitem__ = recording_getitem  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: Any) -> None:
        type(os.environ).__getitem__ = self._original  # type: ignore[method-assign,assignment]


def _importing(frame: Any) -> str:
    """The module whose import runs `frame`: the innermost module body on the stack (a
    function it calls may be another package's; what it keeps from the call is its own)."""
    while frame is not None:
        if frame.f_code.co_name == "<module>":
            return str(frame.f_globals.get("__name__", "?"))
        frame = frame.f_back
    return "?"
