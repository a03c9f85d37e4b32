"""The local resource pool and gang admission.

The machine is a pool of GPUs (found through NVML) and CPU slots. A job starts only when
every one of its ranks fits at once (all-or-nothing); otherwise it waits in a queue ordered
by priority, then submission time. Admission is strict: nothing overtakes the head of the
queue, so a big job can never starve behind a stream of small ones, and two jobs never
hold half their ranks each.
"""

from __future__ import annotations

import functools
import json
import sqlite3
from collections.abc import Callable
from typing import Any

import psutil

from ...jobs.model import JobSpec, SpecError, format_memory


def detect_gpus(setting: str) -> list[int]:
    """GPU indices of the pool: 'auto' asks NVML, 'none' is none, '0,1' is those."""
    return list(_detect_gpus(setting))


@functools.lru_cache(maxsize=8)
def _detect_gpus(setting: str) -> tuple[int, ...]:
    # Cached: a machine's GPUs do not come and go while a process lives, and asking NVML
    # costs tens of milliseconds on every submit otherwise.
    setting = (setting or "auto").strip().lower()
    if setting in ("none", ""):
        return ()
    if setting != "auto":
        try:
            return tuple(sorted({int(part) for part in setting.split(",") if part.strip()}))
        except ValueError:
            raise ValueError(
                f"gpus must be 'auto', 'none' or indices like '0,1', got {setting!r}"
            ) from None
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return tuple(range(pynvml.nvmlDeviceGetCount()))
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - no driver, no library, no GPU: all mean "no GPUs"
        return ()


def pool_capacity(cpu_slots: int, gpus_setting: str, memory_limit: int = 0) -> dict[str, Any]:
    return {
        "cpus": float(cpu_slots),
        "gpus": detect_gpus(gpus_setting),
        "memory": int(memory_limit or psutil.virtual_memory().total),
    }


def job_needs(spec: JobSpec) -> dict[str, Any]:
    return {
        "cpus": spec.cpus * spec.workers,
        "gpus": spec.gpus_per_worker * spec.workers,
        "memory": (spec.memory or 0) * spec.workers,
    }


def check_fits(spec: JobSpec, capacity: dict[str, Any]) -> None:
    """Refuse at submit what could never start, however long it waited."""
    need = job_needs(spec)
    gpus = len(capacity["gpus"])
    if spec.gpus_per_worker and need["gpus"] > gpus:
        have = f"{gpus} GPU{'s' if gpus != 1 else ''}" if gpus else "no GPUs"
        raise SpecError(
            f"this job needs {need['gpus']} GPUs ({spec.workers} workers x {spec.gpus_per_worker}) "
            f"but this machine has {have}"
        )
    if need["cpus"] > capacity["cpus"] + 1e-9:
        raise SpecError(
            f"this job needs {need['cpus']:g} CPU slots ({spec.workers} workers x "
            f"{spec.cpus:g}) but the local pool has {capacity['cpus']:g} "
            "(MLClusterConfig.cpu_slots, env MLCLUSTER_CPU_SLOTS)"
        )
    if need["memory"] > capacity["memory"]:
        raise SpecError(
            f"this job needs {format_memory(need['memory'])} of memory ({spec.workers} workers x "
            f"{format_memory(spec.memory)}) but the local pool has "
            f"{format_memory(capacity['memory'])}"
        )


def used_resources(holding: list[dict[str, Any]]) -> dict[str, Any]:
    used: dict[str, Any] = {"cpus": 0.0, "gpus": set(), "memory": 0}
    for allocation in holding:
        used["cpus"] += allocation.get("cpus", 0.0)
        used["memory"] += allocation.get("memory", 0)
        for gpus in allocation.get("gpus", []):
            used["gpus"].update(gpus)
    return used


def allocate(
    spec: JobSpec, capacity: dict[str, Any], used: dict[str, Any]
) -> dict[str, Any] | None:
    """Resources for every rank at once, or None if they do not all fit now."""
    need = job_needs(spec)
    if used["cpus"] + need["cpus"] > capacity["cpus"] + 1e-9:
        return None
    if used["memory"] + need["memory"] > capacity["memory"]:
        return None
    free_gpus = [g for g in capacity["gpus"] if g not in used["gpus"]]
    if need["gpus"] > len(free_gpus):
        return None
    per_rank = spec.gpus_per_worker
    gpus = [free_gpus[r * per_rank : (r + 1) * per_rank] for r in range(spec.workers)]
    return {"cpus": need["cpus"], "memory": need["memory"], "gpus": gpus}


# JobStore.try_admit's rule: (the job's row, the queue in order, the rows holding resources)
# -> the job's allocation, or None while it waits.
Decider = Callable[[sqlite3.Row, list[sqlite3.Row], list[sqlite3.Row]], dict[str, Any] | None]


def make_decider(is_alive: Callable[[sqlite3.Row], bool]) -> Decider:
    """The admission rule for JobStore.try_admit (runs inside its transaction).

    Walk the queue in order, reserving for every job ahead of us that fits now (its own
    supervisor will take it a moment later); the first one that does not fit blocks
    everyone behind it.
    """
    from ...jobs.model import JobSpec as _Spec

    def decide(
        me: sqlite3.Row, queued: list[sqlite3.Row], holding: list[sqlite3.Row]
    ) -> dict[str, Any] | None:
        capacity = json.loads(me["capacity"])
        allocations = [json.loads(row["allocation"]) for row in holding if is_alive(row)]
        used = used_resources(allocations)
        for row in queued:
            if row["id"] != me["id"] and not is_alive(row):
                continue  # a queued job whose supervisor died holds no place
            spec = _Spec.from_dict(json.loads(row["spec"]))
            allocation = allocate(spec, capacity, used)
            if allocation is None:
                return None
            if row["id"] == me["id"]:
                return allocation
            for key in ("cpus", "memory"):
                used[key] += allocation[key]
            for gpus in allocation["gpus"]:
                used["gpus"].update(gpus)
        return None

    return decide


def describe_wait(spec: JobSpec, capacity: dict[str, Any], used: dict[str, Any], ahead: int) -> str:
    need = job_needs(spec)
    if ahead:
        return f"queued behind {ahead} job{'s' if ahead != 1 else ''}"
    parts = []
    free_cpus = capacity["cpus"] - used["cpus"]
    if need["cpus"] > free_cpus + 1e-9:
        parts.append(f"{need['cpus']:g} CPU slots ({free_cpus:g} free)")
    free_gpus = len([g for g in capacity["gpus"] if g not in used["gpus"]])
    if need["gpus"] > free_gpus:
        parts.append(f"{need['gpus']} GPUs ({free_gpus} free)")
    if need["memory"] > capacity["memory"] - used["memory"]:
        parts.append(f"{format_memory(need['memory'])} memory")
    return "waiting for " + " and ".join(parts) if parts else "waiting for resources"
