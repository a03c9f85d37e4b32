"""The job model: what a job asks for (JobSpec), where it is (JobState, RankState).

Pure data and validation only; no I/O. Every front end (magic, CLI, REST, Python API)
builds a JobSpec and hands it to the JobService; every backend reads one.
"""

from __future__ import annotations

import dataclasses
import decimal
import enum
import math
import re
from collections.abc import Callable
from typing import Any

from .. import bounds, patterns


class SpecError(ValueError):
    """A request that can never run as given (bad option, impossible resources).

    Raised before anything is submitted; the message is meant for the user as-is.
    """


class JobState(str, enum.Enum):
    QUEUED = "queued"
    STARTING = "starting"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def final(self) -> bool:
        return self in FINAL_STATES

    def __str__(self) -> str:  # so f-strings print "running", not "JobState.RUNNING"
        return self.value


FINAL_STATES = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})


class RankState(str, enum.Enum):
    PENDING = "pending"  # not started yet (job queued, or pod not scheduled)
    STARTING = "starting"  # process / pod created, user code not running yet
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"  # stopped by us (cancel, fail-fast, timeout)

    @property
    def final(self) -> bool:
        return self in (RankState.SUCCEEDED, RankState.FAILED, RankState.CANCELLED)

    def __str__(self) -> str:
        return self.value


FRAMEWORKS = ("pytorch", "tensorflow", "jax", "none")
ON_STALL = ("warn", "cancel")
# Experiment trackers a job may record into (jobs/tracking/); "none" is the default.
TRACKERS = ("none", "mlflow")
BACKENDS = ("local", "kubernetes", "slurm")

_NAME_RE = patterns.regex(patterns.JOB_NAME)
JOB_ID_RE = patterns.regex(patterns.JOB_REF)
_ENV_KEY_RE = patterns.regex(patterns.ENV_NAME)
# Variables the engine owns on every rank; a user --env must not silently fight them.
RESERVED_ENV = frozenset(
    {
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
        "GROUP_RANK",
        "MASTER_ADDR",
        "MASTER_PORT",
        "TF_CONFIG",
        "CUDA_VISIBLE_DEVICES",
    }
)

# Every MLCLUSTER_* variable a rank sees is the engine's, but the TensorBoard directory.
ENGINE_ENV_PREFIX = "MLCLUSTER_"

_MEMORY_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGTPE]i?|[kKMGTPE]B?|B)?\s*$")
_MEMORY_UNITS = {
    None: 1,
    "B": 1,
    "k": 1000,
    "K": 1000,
    "kB": 1000,
    "KB": 1000,
    "Ki": 1024,
    "M": 1000**2,
    "MB": 1000**2,
    "Mi": 1024**2,
    "G": 1000**3,
    "GB": 1000**3,
    "Gi": 1024**3,
    "T": 1000**4,
    "TB": 1000**4,
    "Ti": 1024**4,
    "P": 1000**5,
    "PB": 1000**5,
    "Pi": 1024**5,
    "E": 1000**6,
    "EB": 1000**6,
    "Ei": 1024**6,
}


def parse_memory(value: str | int | None) -> int | None:
    """'4Gi', '512M', '2GB', '1073741824' -> bytes. Kubernetes quantity suffixes plus 'GB'."""
    if value is None or value == "":
        return None
    if isinstance(value, bool):
        raise SpecError(f"memory must be a size like '4Gi' or '512M', got {value!r}")
    if isinstance(value, int):
        exact: int | decimal.Decimal = value
    else:
        m = _MEMORY_RE.fullmatch(str(value))
        if not m:
            raise SpecError(
                f"memory must be a size like '4Gi', '512Mi', '2G' or '2GB', got {_shown(value)}"
            )
        number, unit = m.groups()
        # Exact decimal arithmetic: a float turns a 400-digit size into inf (OverflowError).
        exact = decimal.Decimal(number) * _MEMORY_UNITS[unit]
    if not bounds.MEMORY.contains(exact) or int(exact) < 1:
        raise SpecError(
            "memory must be at least 1 byte and at most "
            f"{format_memory(int(bounds.MEMORY.maximum))} "
            f"({bounds.MEMORY.maximum} bytes), got {_shown(value)}"
        )
    return int(exact)


def format_memory(num_bytes: int | None) -> str:
    """Bytes -> the shortest exact Kubernetes quantity ('4Gi', '1500M', '123')."""
    if num_bytes is None:
        return ""
    candidates = [str(num_bytes)]
    for unit in ("Ki", "Mi", "Gi", "Ti", "Pi", "Ei", "k", "M", "G", "T", "P", "E"):
        factor = _MEMORY_UNITS[unit]
        if num_bytes % factor == 0:
            candidates.append(f"{num_bytes // factor}{unit}")
    return min(candidates, key=len)


_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_DURATION_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}


def _one_of(option: str, value: Any, choices: tuple[str, ...] | list[str]) -> str:
    chosen = str(value).lower()
    if chosen not in choices:
        raise SpecError(f"{option} must be one of {', '.join(choices)}, got {value!r}")
    return chosen


def parse_duration(value: str | float | None, option: str = "timeout") -> float | None:
    """'90s', '30m', '1h30m', '2d', '45' (seconds) -> seconds."""
    if value is None or value == "":
        return None
    if isinstance(value, bool):
        raise SpecError(f"{option} must be a duration like '30m' or '1h30m', got {value!r}")
    if isinstance(value, (int, float)):
        seconds = float(value)
    else:
        text = str(value)
        if not patterns.matches(patterns.DURATION, text):
            raise SpecError(
                f"{option} must be a duration like '90s', '30m' or '1h30m', "
                f"{bounds.TIMEOUT.describe()} seconds, got {_shown(value)}"
            )
        parts = _DURATION_PART.findall(text)
        seconds = (
            sum(float(n) * _DURATION_UNITS[unit] for n, unit in parts) if parts else float(text)
        )
    if not math.isfinite(seconds) or not bounds.TIMEOUT.contains(seconds):
        raise SpecError(
            f"{option} must be a duration {bounds.TIMEOUT.describe()} seconds, got {_shown(value)}"
        )
    return seconds


@dataclasses.dataclass
class JobSpec:
    """What the user asked for: the options of %%distributed, snake_case.

    The code itself travels separately (see Payload) because it may be large and binary.
    """

    workers: int = 1
    gpus_per_worker: int = 0
    cpus: float = 1.0
    memory: int | None = None  # bytes per worker
    framework: str = "pytorch"
    backend: str = "local"
    image: str | None = None
    name: str | None = None
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    timeout: float | None = None  # seconds
    max_restarts: int = 0
    queue: str | None = None
    priority: int = 0
    # Where the ranks write TensorBoard data ($MLCLUSTER_TENSORBOARD_DIR): an absolute path or
    # a URI; `{job}` is replaced by the job id when the job is submitted.
    tensorboard: str | None = None
    # Kubernetes, the notebook's own image: install what the notebook added since its pod
    # started in each job pod first (environment.py); --no-sync-packages turns it off.
    sync_packages: bool = True
    # A rank without output, progress or CPU this long is stalled (jobs/forensics/stall.py);
    # None: MLClusterConfig.stall_after; 0: never. What then: warn (flag it) or cancel.
    stall_after: float | None = None
    on_stall: str = "warn"
    # Record the job in an experiment tracker (jobs/tracking/): None, MLClusterConfig.track;
    # "none" or "mlflow".
    track: str | None = None

    FIELDS = (
        "workers",
        "gpus_per_worker",
        "cpus",
        "memory",
        "framework",
        "backend",
        "image",
        "name",
        "env",
        "timeout",
        "max_restarts",
        "queue",
        "priority",
        "tensorboard",
        "sync_packages",
        "stall_after",
        "on_stall",
        "track",
    )

    @classmethod
    def from_options(cls, options: dict[str, Any], *, default_backend: str = "local") -> JobSpec:
        """Build and validate a spec from user-facing options (magic, CLI, REST JSON).

        Accepts strings where users type strings ('4Gi', '30m'); raises SpecError with a
        message naming the option for anything wrong, including unknown options.
        """
        unknown = sorted(set(options) - set(cls.FIELDS))
        if unknown:
            raise SpecError(
                f"unknown option(s): {', '.join(unknown)}; "
                f"valid options are {', '.join(cls.FIELDS)}"
            )
        spec = cls(backend=default_backend)
        # In FIELDS order, so the first error a user sees does not depend on the options' order.
        for field in cls.FIELDS:
            if options.get(field) is not None:
                setattr(spec, field, _OPTIONS[field](options[field]))
        if options.get("tensorboard") is not None and TENSORBOARD_ENV in spec.env:
            raise SpecError(
                f"give the TensorBoard directory once: --tensorboard or --env {TENSORBOARD_ENV}"
            )
        return spec

    def validate(self) -> None:
        """SpecError if this spec (built in Python, not by from_options) is out of bounds
        or malformed: the same checks as every front end's options."""
        JobSpec.from_options(self.to_dict(), default_backend=self.backend)

    def to_dict(self) -> dict[str, Any]:
        return {f: getattr(self, f) for f in self.FIELDS}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> JobSpec:
        """Trusted round trip of to_dict() (from our own store); no validation."""
        return cls(**{k: v for k, v in data.items() if k in cls.FIELDS})


TENSORBOARD_ENV = "MLCLUSTER_TENSORBOARD_DIR"


def parse_stall_after(value: Any) -> float:
    """A duration, or 0 (never flag a stall)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value == 0:
        return 0.0
    if isinstance(value, str) and value.strip() in ("0", "0s", "0m", "0.0"):
        return 0.0
    seconds = parse_duration(value, option="stall_after")
    return 0.0 if seconds is None else seconds


def parse_tensorboard_dir(value: Any, *, option: str = "tensorboard") -> str:
    """A TensorBoard directory template (patterns.tensorboard_dir_problem says what may be
    one), stripped. SpecError otherwise."""
    problem = patterns.tensorboard_dir_problem(value, option)
    if problem:
        raise SpecError(problem)
    return str(value).strip()


def tensorboard_dir_for(template: str, job_id: str) -> str:
    """The directory of one job: the template (checked by parse_tensorboard_dir) with `{job}`."""
    return template.format(job=job_id)


def parse_env(value: Any) -> dict[str, str]:
    """['A=1', 'B=2'] or {'A': '1'} -> {'A': '1', 'B': '2'} with names checked."""
    items: list[tuple[str, Any]]
    if isinstance(value, dict):
        items = list(value.items())
    elif isinstance(value, (list, tuple)):
        items = []
        for entry in value:
            if not isinstance(entry, str) or "=" not in entry:
                raise SpecError(f"env entries must look like KEY=VALUE, got {entry!r}")
            key, _, val = entry.partition("=")
            items.append((key, val))
    else:
        raise SpecError(f"env must be an object of KEY: VALUE, got {type(value).__name__}")
    env: dict[str, str] = {}
    for key, val in items:
        if not isinstance(key, str) or not _ENV_KEY_RE.fullmatch(key):
            raise SpecError(f"env name {key!r} is not a valid environment variable name")
        if key in RESERVED_ENV:
            raise SpecError(f"env {key} is set by mlcluster on every rank and cannot be overridden")
        if key.startswith(ENGINE_ENV_PREFIX) and key != TENSORBOARD_ENV:
            # The engine's own channel to its ranks (payload, report pipe, session, result
            # paths...): a user's value would silently turn a job's rank into something else
            # (a session rank that waits for commands and runs nothing, say).
            raise SpecError(
                f"env {key}: {ENGINE_ENV_PREFIX}* names are mlcluster's own "
                f"(of them only {TENSORBOARD_ENV} may be set)"
            )
        if isinstance(val, (dict, list)):
            raise SpecError(f"env {key} must be a string, got {type(val).__name__}")
        env[key] = "" if val is None else str(val)
    return env


# An integer typed with more digits than this is out of every bound (and int() of a string
# refuses more than 4300 digits with a message about "int string conversion").
_MAX_INT_DIGITS = 40
_INT_TEXT = re.compile(r"^\s*[+-]?\d+\s*$")


def _shown(value: Any) -> str:
    """A value for an error message, shortened: a 400-digit number is echoed as its start."""
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:30]}... ({len(text)} characters)"


def _as_int(option: str, value: Any, bound: bounds.Bound) -> int:
    if isinstance(value, bool):
        raise SpecError(f"{option} must be an integer, got {value!r}")
    number: int | None = None
    if isinstance(value, str) and _INT_TEXT.match(value) and len(value) > _MAX_INT_DIGITS:
        raise SpecError(f"{option} must be {bound.describe()}, got {_shown(value)}")
    try:
        number = int(value) if not isinstance(value, float) or value.is_integer() else None
    except (TypeError, ValueError, OverflowError):
        number = None
    if number is None:
        raise SpecError(f"{option} must be an integer, got {_shown(value)}")
    if not bound.contains(number):
        raise SpecError(f"{option} must be {bound.describe()}, got {_shown(number)}")
    return number


def _as_float(option: str, value: Any, bound: bounds.Bound) -> float:
    if isinstance(value, bool):
        raise SpecError(f"{option} must be a number, got {value!r}")
    try:
        number = float(value)
    except OverflowError:  # an int too large for a float
        number = math.inf
    except (TypeError, ValueError):
        raise SpecError(f"{option} must be a number, got {_shown(value)}") from None
    if not math.isfinite(number) or not bound.contains(number):
        raise SpecError(f"{option} must be {bound.describe()}, got {_shown(value)}")
    return number


def _image(value: Any) -> str:
    image = str(value).strip()
    if not image or any(c.isspace() for c in image):
        raise SpecError(f"image must be a container image reference, got {value!r}")
    return image


def _name(value: Any) -> str:
    name = str(value)
    if not _NAME_RE.fullmatch(name):
        raise SpecError(
            f"name must be 1-53 lowercase letters, digits or '-', starting and ending "
            f"with a letter or digit (it names Kubernetes objects), got {name!r}"
        )
    return name


def _queue(value: Any) -> str:
    queue = str(value).strip()
    if not queue:
        raise SpecError("queue must not be empty")
    return queue


def _sync_packages(value: Any) -> bool:
    if not isinstance(value, bool):
        raise SpecError(f"sync_packages must be true or false, got {value!r}")
    return value


# Each option of JobSpec.FIELDS: what its user-facing value (a string where users type one)
# becomes in the spec, or a SpecError naming the option.
_OPTIONS: dict[str, Callable[[Any], Any]] = {
    "workers": lambda v: _as_int("workers", v, bounds.WORKERS),
    "gpus_per_worker": lambda v: _as_int("gpus_per_worker", v, bounds.GPUS_PER_WORKER),
    "cpus": lambda v: _as_float("cpus", v, bounds.CPUS),
    "memory": parse_memory,
    "framework": lambda v: _one_of("framework", v, FRAMEWORKS),
    "backend": lambda v: _one_of("backend", v, BACKENDS),
    "image": _image,
    "name": _name,
    "env": parse_env,
    "timeout": parse_duration,
    "max_restarts": lambda v: _as_int("max_restarts", v, bounds.MAX_RESTARTS),
    "queue": _queue,
    "priority": lambda v: _as_int("priority", v, bounds.PRIORITY),
    "tensorboard": parse_tensorboard_dir,
    "sync_packages": _sync_packages,
    "stall_after": parse_stall_after,
    "on_stall": lambda v: _one_of("on_stall", v, ON_STALL),
    "track": lambda v: _one_of("track", v, TRACKERS),
}
