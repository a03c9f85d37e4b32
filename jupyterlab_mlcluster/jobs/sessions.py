"""Sessions: a user's named gang of live ranks that keep their state from cell to cell.

A session is a long-running job, its *holder*: gang-admitted like any job (its allocation
holds the gang's CPU slots and GPUs while it lives; jobs and other sessions queue behind
it), with one supervisor and one set of rank processes, whose local backend serves cells
instead of running one payload (backends/local/session.py, runtime/session_worker.py). The
store's `sessions` table names it: (owner, name) -> holder job, cells run, idle since.

Each cell run in a session is a job record of its own (logs, state, result, error report,
monitor, sidebar, history): stored `starting` with its origin naming the session
(`session`, `session_job`), never with a supervisor of its own: the holder's supervisor
claims it, runs it on the ranks and finishes it. A submitter wakes that supervisor through
the FIFO in the holder's 0700 job directory (`poke_session`); the supervisor trusts nothing
of the message but a job id, which it checks against the store (the cell's owner and
session must be its own), and it also scans the store, so a lost wake-up only costs time.

Sessions belong to their owner: every lookup here is by (owner, name), so another user can
neither see, run in, interrupt nor stop one (an unknown name, exactly as a missing one).
A session outlives the kernel that started it; it ends when stopped, after
`MLClusterConfig.session_idle_timeout` without a cell, or when a rank process dies.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import os
import stat
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .. import patterns
from .model import JobSpec, JobState, SpecError
from .owner import current_user

if TYPE_CHECKING:
    from ..runtime.payload import Payload
    from .record import JobRecord
    from .service import JobService
    from .storage.store import JobStore

FIFO_NAME = "session.fifo"
# Options a cell sets for itself; every other job option shapes the session's gang, fixed
# when it starts: a later cell may repeat one (same value) or leave it out, and a different
# value is an error, never silently ignored (a new job option is a gang option unless named
# here).
CELL_OPTIONS = ("name", "timeout")
GANG_OPTIONS = tuple(f for f in JobSpec.FIELDS if f not in CELL_OPTIONS)
RESTART_WAIT = 60.0


class SessionError(SpecError):
    """A session cannot do what was asked (unknown, ended, options that would change it)."""


class UnknownSession(SessionError):
    def __init__(self, name: str):
        super().__init__(f"no session {name!r} (see %distributed_session list)")


class SessionEnded(SessionError):
    """The session a cell asked for ended by failure since its last cell: said once."""

    def _render_traceback_(self) -> list[str]:
        return [f"\x1b[31mDistributedSessionEnded\x1b[0m: {self}"]


def check_session_name(name: str) -> str:
    if not isinstance(name, str) or not patterns.matches(patterns.SESSION_NAME, name):
        raise SessionError(
            f"--session {name!r}: a session name is 1-40 lowercase letters, digits and '-'"
            " (starting and ending with a letter or digit)"
        )
    return name


def is_session_holder(record: JobRecord) -> bool:
    return bool(record.origin.get("session")) and not record.origin.get("session_job")


def is_session_cell(record: JobRecord) -> bool:
    return bool(record.origin.get("session_job"))


# -- waking the session's supervisor ------------------------------------------------------


def poke_session(store: JobStore, holder_id: str, message: str) -> bool:
    """Write one line to the session's FIFO (its supervisor reads it at once). False when
    nobody reads it now (the supervisor is starting, or gone): its store scan finds the
    news later. Never blocks; never follows a link; only a FIFO is written."""
    path = store.job_dir(holder_id) / FIFO_NAME
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno in (errno.ENXIO, errno.ENOENT, errno.ELOOP, errno.EACCES):
            return False
        raise
    try:
        info = os.fstat(fd)
        if not stat.S_ISFIFO(info.st_mode) or info.st_uid != os.getuid():
            return False
        os.write(fd, message.encode() + b"\n")  # one line < PIPE_BUF: written whole
        return True
    except BlockingIOError:
        return False  # a full FIFO: the supervisor is behind, and will scan
    finally:
        os.close(fd)


# -- the view of a session (REST, CLI, %distributed_session list) -------------------------


@dataclasses.dataclass
class SessionInfo:
    name: str
    owner: str | None
    holder: JobRecord
    created: float
    cells: int
    idle_since: float | None

    @property
    def live(self) -> bool:
        return not self.holder.final

    def to_json(self) -> dict[str, Any]:
        from .record import iso

        job = self.holder
        ranks = [r.to_json() for r in job.ranks]
        memory = [r["metrics"]["memory_bytes"] for r in ranks]
        return {
            "name": self.name,
            "owner": self.owner,
            "id": job.id,
            "state": str(job.state),
            "reason": job.reason or job.error,
            "backend": job.spec.backend,
            "workers": job.spec.workers,
            "gpus_per_worker": job.spec.gpus_per_worker,
            "gpus": job.spec.workers * job.spec.gpus_per_worker,
            "memory_bytes": sum(m for m in memory if m) if any(memory) else None,
            "cells": self.cells,
            "restarts": job.restarts,
            "created": iso(self.created),
            "finished": iso(job.finished),
            "idle_since": iso(self.idle_since) if self.live else None,
            "gpu_idle_since": iso(job.gpu_idle_since) if self.live else None,
            "ranks": ranks,
        }


def _info(store: JobStore, row: dict[str, Any]) -> SessionInfo:
    return SessionInfo(
        name=row["name"],
        owner=row["owner"],
        holder=store.get_job(row["job_id"]),
        created=row["created"],
        cells=row["cells"],
        idle_since=row["idle_since"],
    )


def list_sessions(
    service: JobService, owner: str | None, *, include_ended: bool = False
) -> list[SessionInfo]:
    """`owner`'s sessions (None: everyone's, for the store's own user), live ones unless
    `include_ended`."""
    service.reap()
    rows = service.store.session_rows(owner, live_only=not include_ended)
    return [_info(service.store, row) for row in rows]


def get_session(service: JobService, owner: str | None, name: str) -> SessionInfo:
    """The live session `name` of `owner`; UnknownSession otherwise (another user's too)."""
    service.reap()
    rows = service.store.session_rows(owner, name, live_only=True)
    if not rows:
        raise UnknownSession(name)
    return _info(service.store, rows[0])


def stop_session(
    service: JobService, owner: str | None, name: str, *, wait: bool = True
) -> SessionInfo:
    """End the session: its ranks run their atexit handlers and exit, its slots are freed.
    `wait=False`: only ask (the REST server then waits on its event loop)."""
    info = get_session(service, owner, name)
    service.cancel(info.holder.id, wait=wait)
    return session_info(service, owner, name)


def request_restart(service: JobService, owner: str | None, name: str) -> tuple[str, int]:
    """Ask the session's supervisor for fresh ranks; (holder id, its restarts before) for
    `restarted`. Only a running session restarts: one still queued or starting would
    carry the request into its start, and an ended one has nothing to restart."""
    info = get_session(service, owner, name)
    holder = info.holder
    if holder.state != JobState.RUNNING:
        raise SessionError(
            f"session {name!r} has ended"
            if holder.final
            else f"session {name!r} is {holder.state}: only a running session restarts"
        )
    service.store.update_session(holder.id, restart_requested=1)
    poke_session(service.store, holder.id, "restart")
    return holder.id, holder.restarts


def restarted(record: JobRecord, before: int) -> bool:
    """The restart asked when the holder had `before` restarts is done (or the session ended)."""
    return record.restarts > before or record.final


def restart_session(
    service: JobService, owner: str | None, name: str, timeout: float = RESTART_WAIT
) -> SessionInfo:
    """Fresh ranks for the session (its state is lost), same gang and allocation; returns
    once the supervisor has started them. Blocking: the REST server waits on its event
    loop instead (server/handlers/sessions.py)."""
    holder_id, before = request_restart(service, owner, name)
    deadline = time.monotonic() + timeout
    while not restarted(service.store.get_job(holder_id), before):
        if time.monotonic() >= deadline:
            raise SessionError(f"session {name!r} did not restart within {timeout:g} s")
        time.sleep(0.02)
    return session_info(service, owner, name)


def session_info(service: JobService, owner: str | None, name: str) -> SessionInfo:
    """The session as it stands (ended ones too), UnknownSession if it has no row."""
    rows = service.store.session_rows(owner, name)
    if not rows:
        raise UnknownSession(name)
    return _info(service.store, rows[0])


# -- running a cell -----------------------------------------------------------------------


def ended_cell_error(session: JobRecord | None) -> str:
    """What a cell of a session that ended before running it fails with (`session`: its
    holder, None if gone): the same words whoever settles the cell (the reaper, or
    submit_cell when the session ended while the cell was stored)."""
    said = session and (session.reason or session.error)
    return f"the session ended{f': {said}' if said else ''}; its state is lost"


def _supervised(holder: JobRecord) -> bool:
    """The session's supervisor is alive (a process check on this host; a fresh heartbeat
    elsewhere), or has not started yet."""
    from .running.processes import holder_alive

    return not holder.supervisor or holder_alive(holder.supervisor, holder.heartbeat)


def check_unchanged(
    name: str, options: dict[str, Any], spec: JobSpec, default_backend: str
) -> None:
    """SessionError if `options` would change the live session's gang."""
    asked = JobSpec.from_options(
        {k: v for k, v in options.items() if k in GANG_OPTIONS}, default_backend=spec.backend
    )
    for option in GANG_OPTIONS:
        if option in options and getattr(asked, option) != getattr(spec, option):
            flag = "--" + option.replace("_", "-")
            raise SessionError(
                f"{flag}: session {name!r} is running with {flag.lstrip('-')}="
                f"{getattr(spec, option)!r}; options that shape its ranks ("
                + ", ".join("--" + o.replace("_", "-") for o in GANG_OPTIONS[:7])
                + f", ...) cannot change while it lives: leave them out, or"
                f" %distributed_session stop {name} first"
            )


def start_session(
    service: JobService,
    name: str,
    spec: JobSpec,
    *,
    origin: dict[str, Any],
    environ: dict[str, str] | None = None,
    cwd: str | None = None,
    preload: list[str] | None = None,
) -> JobRecord:
    """Submit the session's holder job (gang-admitted like a job) and record the session;
    if another process started a live session of that name meanwhile, that one wins."""
    from ..runtime.payload import Payload

    if spec.backend not in ("local", "kubernetes", "slurm"):
        raise SessionError(
            "--session: sessions run on the local, kubernetes and slurm backends, not"
            f" {spec.backend!r}"
        )
    holder_spec = dataclasses.replace(spec, name=name, timeout=None, max_restarts=0)
    holder_origin = {k: v for k, v in origin.items() if k not in ("session", "session_job")}
    holder_origin["session"] = name
    owner = holder_origin.get("user") or current_user()
    holder_origin["user"] = owner
    record = service.submit(
        holder_spec,
        Payload(kind="code", source="pass\n"),
        origin=holder_origin,
        environ=environ,
        cwd=cwd,
        preload=preload,
    )
    winner = service.store.add_session(record.id, owner, name)
    if winner != record.id:
        with contextlib.suppress(Exception):
            service.cancel(record.id, purge=True)
        return service.store.get_job(winner)
    return record


def submit_cell(
    service: JobService,
    name: str,
    options: dict[str, Any],
    payload: Payload,
    *,
    origin: dict[str, Any],
    environ: dict[str, str] | None = None,
    cwd: str | None = None,
    preload: list[str] | Callable[[], list[str]] | None = None,
) -> tuple[JobRecord, str | None]:
    """Run a cell in the session `name` of the origin's user, starting the session (with
    `options`) when it has none by that name. Returns (the cell's job record, a note to show
    the user or None). SessionEnded: the session failed since its last cell (said once; the
    next cell starts a fresh one). `preload` (or a function returning it, called only when
    the session starts): what the warm pool should preload for its ranks."""
    from .record import JobRecord, new_job_id

    check_session_name(name)
    store = service.store
    owner = origin.get("user") or current_user()
    origin = {**origin, "user": owner}
    default_backend = service.config.default_backend
    cell_spec = JobSpec.from_options(options, default_backend=default_backend)
    if cell_spec.stall_after is not None or cell_spec.on_stall != "warn":
        # A session's ranks idle between cells by design: nothing watches them for stalls.
        raise SpecError("--stall-after and --on-stall do not apply to a session's cells")
    note = None
    live = store.session_rows(owner, name, live_only=True)
    holder = store.get_job(live[0]["job_id"]) if live else None
    if holder is not None and not _supervised(holder):
        # Its supervisor died (killed, its machine rebooted): settle it now, so this cell
        # says the session ended instead of waiting for a supervisor that will never come.
        service.reap(force=True)
        live = store.session_rows(owner, name, live_only=True)
        holder = store.get_job(live[0]["job_id"]) if live else None
    if holder is not None:
        check_unchanged(name, options, holder.spec, default_backend)
    else:
        ended = store.session_rows(owner, name)
        if ended and not ended[0]["end_reported"]:
            store.update_session(ended[0]["job_id"], end_reported=1)
            why = ended[0]["reason"] or ended[0]["error"] or str(ended[0]["state"])
            if ended[0]["state"] == str(JobState.FAILED):
                raise SessionEnded(
                    f"session {name!r} ended: {why}; its state is lost. Run the cell again"
                    " to start a fresh session."
                )
            note = f"session {name!r} had ended ({why}); starting a new one"
        holder = start_session(
            service,
            name,
            cell_spec,
            origin=origin,
            environ=environ,
            cwd=cwd,
            preload=preload() if callable(preload) else preload,
        )
    spec = dataclasses.replace(holder.spec, name=cell_spec.name or name, timeout=cell_spec.timeout)
    cell_id = new_job_id()
    inherit = service.backend(holder.spec.backend).ranks_inherit_environment
    data, files = service.job_files(cell_id, payload, environ, cwd, inherit_environment=inherit)
    record = JobRecord(
        id=cell_id,
        name=spec.name or name,
        spec=spec,
        state=JobState.STARTING,
        created=time.time(),
        owner=owner,
        origin={**origin, "session": name, "session_job": holder.id},
        reason=f"waiting for session {name}",
    )
    store.insert_job(record, data, files)
    poke_session(store, holder.id, f"cell {cell_id}")
    session_now = store.get_job(holder.id)
    if session_now.final:
        # The session ended while the cell was stored (its supervisor's last look at its
        # waiting cells may have come first, or a killed supervisor's sentinel settled it
        # after the look above found it alive): the cell says so now, not after the
        # reaper's claim grace, in the reaper's words (which of the two gets there first
        # is a race).
        why = ended_cell_error(session_now)
        store.transition(cell_id, JobState.FAILED, error=why, reason=why)
    return store.get_job(cell_id), note
