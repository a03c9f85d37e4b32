"""Which generation serves a job: the one that covers its wish and fits its environment;
else the nearest, while one that does is built (within the memory budget, one build at a
time, and for a job's own values: an env-keyed generation); learning ahead of the jobs."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .client import (
    START_TIMEOUT,
    _build_underway,
    _building,
    _generations,
    _memory,
    _ping,
    _stop_generation,
    ensure_zygote,
    request,
    requested_modules,
)
from .environment import _fit_key
from .place import _ENV_KEYS, UnsafePoolDir, _warn_once, env_fingerprint, fingerprint, pool_dir

if TYPE_CHECKING:
    from ...config import MLClusterConfig


def _within_memory(
    config: MLClusterConfig, generations: list[dict[str, Any]], serving: dict[str, Any]
) -> bool:
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
    config: MLClusterConfig,
    want: list[str],
    env: Mapping[str, str] | None = None,
    needs: list[str] | None = None,
) -> Path | None:
    """The socket of the generation that should fork a job wanting `want` preloaded, whose
    ranks' environment is `env` (None: any generation fits).

    Only generations that fit `env` (none of the variables they imported or started with
    differs) are candidates. One that has all of `want` serves (the smallest such), and
    generations it supersedes retire. Otherwise a generation with them is built in the
    background (memory allowing) while the nearest ready one serves; with none ready, the
    job waits for the new one (the first cell pays the preload). When generations run but
    none fits `env`, the nearest serves (its supervisor starts the ranks cold) while one
    keyed by the job's values is prepared (_prepare_for).

    `needs`: the modules the job's own code imports (preload.payload_imports; None: not
    known). A generation being built for the wish is waited for only when the nearest ready
    one lacks some of them that the build will have (_needs_build)."""
    return _serving(config, want, env, needs)[0]


def _serving(
    config: MLClusterConfig,
    want: list[str],
    env: Mapping[str, str] | None = None,
    needs: list[str] | None = None,
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
    if _needs_build(nearest, want, needs):
        built = _await_build(want, nearest.get("overlay"))
        if built is not None:
            return built, True, None
    # One build at a time: the next cell's slightly different wish waits for this one's
    # generation (which may cover it) rather than start a second build on the same cores.
    if not _build_underway() and _within_memory(config, current, nearest):
        ensure_zygote(config, wait=False, modules=want, overlay=nearest.get("overlay"))
    return Path(nearest["socket"]), False, None


def _needs_build(nearest: dict[str, Any], want: list[str], needs: list[str] | None) -> bool:
    """Whether a job whose code imports `needs` would gain from the generation being built
    for `want`: the nearest ready generation lacks one of `needs` that the build will have
    (one of `want`). Modules outside `want` are in no build (the ranks import them either
    way); None (the imports are not known: a magic, a callable, __import__): assume so."""
    if needs is None:
        return True
    wanted = set(want)
    relevant = [name for name in needs if name in wanted]
    if not relevant:
        return False
    info = _ping(Path(nearest["socket"]), relevant)
    return info is None or bool(info.get("missing", 1))


def _await_build(want: list[str], overlay: Mapping[str, str | None] | None) -> Path | None:
    """The generation for exactly this wish is being built (the kernel learned its import
    ahead, or an earlier job asked for it): wait for it (until it serves, dies, or
    START_TIMEOUT). Its socket, or None (no such build, or it never served). Waiting costs
    the rest of one import; the nearest generation's ranks would each import what it lacks,
    all at once, on the cores the build is using (a first transformers cell under load:
    14 s against the build's rest)."""
    fp = fingerprint(want, overlay=overlay)
    directory = pool_dir()
    path = directory / f"zygote-{fp}.sock"
    deadline = time.monotonic() + START_TIMEOUT
    while _building(directory, fp) and time.monotonic() < deadline:
        if _ping(path) is not None:
            return path
        time.sleep(0.05)
    return path if _ping(path) is not None else None


def _prepare_for(
    config: MLClusterConfig,
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


def learn_ahead(config: MLClusterConfig, learned: list[str]) -> bool:
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
    config: MLClusterConfig,
    store_root: str,
    job_id: str,
    learned: list[str] | tuple[str, ...] = (),
    job_env: Mapping[str, str] | None = None,
    needs: list[str] | None = None,
) -> bool:
    """Fork the job's supervisor from the zygote. False: use a cold start instead.

    `learned`: modules the submitter imports (a kernel's, a script's top imports) that
    preload.py found preloadable. `job_env`: what the job's ranks' environment will be
    (the submitter's and the job's --env): the generation chosen must fit it, and when none
    does, one keyed by its values is prepared (None: any generation fits). `needs`: what
    the job's code imports (serving_generation)."""
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
        path, covers, note = _serving(config, want, job_env, needs)
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
