"""Hyperparameter sweeps, the pure part: parse `--sweep` options, expand them into trials,
pick the best trial. No I/O; `jobs/experiments/sweep.py` submits the trials as ordinary jobs.

    --sweep lr=0.1,0.01 --sweep batch=32,64          grid: every combination (4 trials)
    --sweep lr=loguniform(1e-4,1e-1) --trials 20     random search: 20 draws
    --sweep act=choice('relu','gelu')                a list to draw from (or to grid over)
"""

from __future__ import annotations

import ast
import dataclasses
import itertools
import keyword
import math
import random
import re
from typing import Any

from ..model import SpecError

MAX_TRIALS = 1000
MODES = ("min", "max")

_DIST_RE = re.compile(r"^(uniform|loguniform|choice)\((.*)\)$", re.DOTALL)
_CALL_RE = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)\((.*)\)$", re.DOTALL)


class SweepError(SpecError):
    """A sweep that cannot run as given; nothing is submitted."""


@dataclasses.dataclass(frozen=True)
class Param:
    """One swept name: a list of values, or a distribution to draw from."""

    name: str
    kind: str  # "values" | "uniform" | "loguniform"
    values: tuple[Any, ...] = ()
    low: float = 0.0
    high: float = 0.0

    def draw(self, rng: random.Random) -> Any:
        if self.kind == "values":
            return self.values[rng.randrange(len(self.values))]
        if self.kind == "uniform":
            return rng.uniform(self.low, self.high)
        return math.exp(rng.uniform(math.log(self.low), math.log(self.high)))

    def describe(self) -> str:
        if self.kind == "values":
            return ",".join(repr(v) for v in self.values)
        return f"{self.kind}({self.low:g},{self.high:g})"


@dataclasses.dataclass
class SweepSpec:
    """What `--sweep/--trials/--parallel/--metric/--mode/--seed` asked for."""

    params: list[Param]
    trials: int | None = None  # None: grid search
    parallel: int | None = None  # None: as many as the backend admits
    metric: str | None = None
    mode: str = "min"
    seed: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "params": {p.name: p.describe() for p in self.params},
            "trials": self.trials,
            "parallel": self.parallel,
            "metric": self.metric,
            "mode": self.mode,
            "seed": self.seed,
        }


def _literal(text: str) -> Any:
    """'0.1' -> 0.1, '32' -> 32, "'relu'" -> 'relu', 'relu' -> 'relu', 'True' -> True."""
    text = text.strip()
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return text


def _split_args(text: str) -> list[str]:
    """Split 'a, (1, 2), "x,y"' at top-level commas (Python's own tokenizer decides)."""
    try:
        tree = ast.parse(f"f({text})", mode="eval")
    except SyntaxError:
        return [part for part in text.split(",")]
    call = tree.body
    assert isinstance(call, ast.Call)
    if call.keywords:
        raise SweepError(f"keyword arguments are not allowed here: {text!r}")
    return [ast.get_source_segment(f"f({text})", arg) or "" for arg in call.args]


def parse_param(option: str) -> Param:
    """'lr=0.1,0.01' / 'lr=loguniform(1e-4,1e-1)' / 'act=choice(relu,gelu)' -> Param."""
    name, sep, spec = option.partition("=")
    name = name.strip()
    spec = spec.strip()
    if not sep or not name:
        raise SweepError(f"--sweep {option}: write NAME=V1,V2,... or NAME=uniform(a,b)")
    if not name.isidentifier() or keyword.iskeyword(name):
        raise SweepError(f"--sweep {option}: {name!r} is not a Python variable name")
    if not spec:
        raise SweepError(f"--sweep {name}=: no values; write {name}=V1,V2,... or a distribution")
    dist = _DIST_RE.fullmatch(spec)
    call = _CALL_RE.fullmatch(spec)
    if call and not dist:
        raise SweepError(
            f"--sweep {name}={spec}: unknown distribution {call.group(1)!r}; "
            "use uniform(a,b), loguniform(a,b) or choice(v1,v2,...)"
        )
    if dist:
        kind, inner = dist.groups()
        parts = [p.strip() for p in _split_args(inner)]
        if not parts or any(not p for p in parts):
            raise SweepError(f"--sweep {name}={spec}: {kind}() needs its arguments")
        if kind == "choice":
            return Param(name, "values", tuple(_literal(p) for p in parts))
        if len(parts) != 2:
            raise SweepError(f"--sweep {name}={spec}: {kind}() takes two bounds, low and high")
        try:
            low, high = (float(_literal(p)) for p in parts)
        except (TypeError, ValueError):
            raise SweepError(f"--sweep {name}={spec}: the bounds must be numbers") from None
        if not (math.isfinite(low) and math.isfinite(high)) or not low < high:
            raise SweepError(f"--sweep {name}={spec}: need finite bounds with low < high")
        if kind == "loguniform" and low <= 0:
            raise SweepError(f"--sweep {name}={spec}: loguniform bounds must be positive")
        return Param(name, kind, low=low, high=high)
    parts = [p.strip() for p in spec.split(",")]
    if any(not p for p in parts):
        raise SweepError(f"--sweep {name}={spec}: an empty value in the list")
    return Param(name, "values", tuple(_literal(p) for p in parts))


def parse_sweep(
    options: list[str] | None,
    *,
    trials: Any = None,
    parallel: Any = None,
    metric: str | None = None,
    mode: str | None = None,
    seed: Any = None,
) -> SweepSpec | None:
    """The sweep the options describe, or None when there is no --sweep (an ordinary job).

    Options that only make sense with --sweep are refused without one."""
    if not options:
        extra = [
            flag
            for flag, value in (
                ("--trials", trials),
                ("--parallel", parallel),
                ("--metric", metric),
                ("--mode", mode),
                ("--seed", seed),
            )
            if value is not None
        ]
        if extra:
            raise SweepError(f"{', '.join(extra)} only apply to a sweep (add --sweep NAME=...)")
        return None
    params = [parse_param(o) for o in options]
    names = [p.name for p in params]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise SweepError(f"--sweep {duplicates[0]} is given twice")
    spec = SweepSpec(params=params, metric=metric or None)
    if trials is not None:
        spec.trials = _positive_int("--trials", trials)
        if spec.trials > MAX_TRIALS:
            raise SweepError(f"--trials {spec.trials}: at most {MAX_TRIALS} trials per sweep")
    if parallel is not None:
        spec.parallel = _positive_int("--parallel", parallel)
    if mode is not None:
        if mode not in MODES:
            raise SweepError(f"--mode must be min or max, got {mode!r}")
        spec.mode = mode
    if seed is not None:
        try:
            spec.seed = int(seed)
        except (TypeError, ValueError):
            raise SweepError(f"--seed must be an integer, got {seed!r}") from None
    if metric is not None and not str(metric).strip():
        raise SweepError("--metric needs a name")
    if spec.trials is None:
        random_params = [p.name for p in params if p.kind != "values"]
        if random_params:
            raise SweepError(
                f"--sweep {random_params[0]} draws from a distribution: "
                "say how many draws with --trials N"
            )
        size = math.prod(len(p.values) for p in params)
        if size > MAX_TRIALS:
            raise SweepError(
                f"the grid has {size} combinations (more than {MAX_TRIALS}); "
                "sample it with --trials N or sweep fewer values"
            )
    return spec


def expand(spec: SweepSpec) -> list[dict[str, Any]]:
    """Every trial's parameters, in trial order. Grid: the product of the value lists
    (the first --sweep varies slowest). Random: `trials` draws from a generator seeded with
    `seed`, so the same seed gives the same trials."""
    if spec.trials is None:
        combos = itertools.product(*(p.values for p in spec.params))
        return [dict(zip((p.name for p in spec.params), combo, strict=True)) for combo in combos]
    rng = random.Random(spec.seed)
    return [{p.name: p.draw(rng) for p in spec.params} for _ in range(spec.trials)]


def metric_of(value: Any, metric: str | None) -> Any:
    """A trial's score: the named entry of rank 0's value (a dict key or an attribute),
    or rank 0's value itself when no metric is named. None if there is none."""
    if metric is None:
        return value
    if isinstance(value, dict):
        return value.get(metric)
    return getattr(value, metric, None)


def is_score(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value)


def best_index(scores: list[Any], mode: str) -> int | None:
    """Index of the best numeric score (lowest for min, highest for max; first on ties)."""
    ranked = [(s, i) for i, s in enumerate(scores) if is_score(s)]
    if not ranked:
        return None
    pick = min if mode == "min" else max
    best = pick(s for s, _ in ranked)
    return next(i for s, i in ranked if s == best)


def _positive_int(option: str, value: Any) -> int:
    try:
        number = int(str(value).strip())
    except (TypeError, ValueError):
        raise SweepError(f"{option} must be a positive integer, got {value!r}") from None
    if number < 1:
        raise SweepError(f"{option} must be a positive integer, got {value!r}")
    return number


def format_value(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
