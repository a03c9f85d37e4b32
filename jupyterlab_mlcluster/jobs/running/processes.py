"""Process bookkeeping shared by every part that starts or judges processes.

A process is named by (host, pid, create_time): a pid alone may be reused. Whoever
started a process (the submitter starting a supervisor, a supervisor starting ranks, the
zygote) records that triple; whoever later asks "is it still there?" asks here.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import threading
import time
from collections.abc import Mapping
from typing import Any, BinaryIO

import psutil

# A freshly submitted job's supervisor may take this long to claim it (a cold Python start
# on a loaded machine) before the job counts as never started.
CLAIM_GRACE = 60.0

# A supervisor writes its job's heartbeat (store row, wall-clock time) this often.
HEARTBEAT_INTERVAL = 1.0
# Another host's supervisor is judged by its heartbeat alone (its pid means nothing here):
# dead once the heartbeat is this old. Three missed beats, but never under a minute: the two
# hosts' clocks may differ by seconds, a store on a slow NFS server can stall a write for
# many, and a Kubernetes supervisor's API call may block a while between beats. Until then
# its job stays running and --purge refuses it.
HEARTBEAT_STALE = max(3 * HEARTBEAT_INTERVAL, 60.0)


def this_host() -> str:
    return os.uname().nodename


def process_is(pid: int | None, create_time: float | None) -> bool:
    """Is `pid` still the very process that was started at `create_time`?"""
    if not pid:
        return False
    try:
        proc = psutil.Process(pid)
        if create_time is not None and abs(proc.create_time() - create_time) > 0.05:
            return False
        return proc.status() != psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


def heartbeat_age(heartbeat: float | None, now: float | None = None) -> float:
    """Seconds since a heartbeat (infinite if there never was one)."""
    if heartbeat is None:
        return float("inf")
    return max(0.0, (time.time() if now is None else now) - heartbeat)


def holder_alive(identity: Mapping[str, Any] | None, heartbeat: float | None) -> bool:
    """Is the supervisor named by `identity` (pid, create_time, host) still there? On this
    host: the very process. On another: its heartbeat is fresh (HEARTBEAT_STALE)."""
    if not identity:
        return False
    if identity.get("host") == this_host():
        return process_is(identity.get("pid"), identity.get("create_time"))
    return heartbeat_age(heartbeat) < HEARTBEAT_STALE


def supervisor_alive(row: Mapping[str, Any] | sqlite3.Row) -> bool:
    """A job's store row -> is its supervisor still the process that claimed it?"""
    raw = row["supervisor"]
    if not raw:
        # Not claimed yet: give a freshly submitted job time for its supervisor to start.
        return time.time() - row["created"] < CLAIM_GRACE
    return holder_alive(json.loads(raw), row["heartbeat"])


def submitter_gone(origin: Mapping[str, Any]) -> bool:
    """Has the process a job is attached to (the foreground CLI that submitted it, whose
    end cancels the job) ended? Judged on its own host only."""
    pid = origin.get("attach_pid")
    if not pid or origin.get("attach_host", this_host()) != this_host():
        return False
    return not process_is(pid, origin.get("attach_create_time"))


def supervisor_lost_reason(row: Mapping[str, Any] | sqlite3.Row) -> str:
    """Why a job whose supervisor is not alive (supervisor_alive) is being failed."""
    if not row["supervisor"]:
        return "the job's supervisor process never started"
    info = json.loads(row["supervisor"])
    if info.get("host") != this_host():
        age = heartbeat_age(row["heartbeat"])
        since = "never beat" if age == float("inf") else f"last beat {age:.0f} s ago"
        return (
            f"the job's supervisor on host {info.get('host')!r} stopped answering"
            f" ({since}; a host's supervisor counts as dead after {HEARTBEAT_STALE:.0f} s):"
            " its host died or lost the job store"
        )
    return "the job's supervisor process died unexpectedly"


def start_detached(
    argv: list[str],
    log: BinaryIO,
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    reaper_name: str | None = None,
    pass_fds: tuple[int, ...] = (),
) -> subprocess.Popen:
    """Start `argv` in its own session (no terminal signals reach it), its output going to
    `log` (an open file, closed here once the child holds it).

    A daemon thread waits for it, so no zombie stays behind in a long-lived starter."""
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=None if env is None else dict(env),
            cwd=cwd,
            close_fds=True,
            pass_fds=pass_fds,
        )
    finally:
        log.close()
    threading.Thread(target=proc.wait, name=reaper_name, daemon=True).start()
    return proc
