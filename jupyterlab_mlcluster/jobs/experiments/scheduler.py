"""Who fires schedules: `Scheduler.fire_due()`, called by the `mlcluster scheduler` daemon and
by every Jupyter server with the extension (in an executor thread). Any number of them may
run at once: a tick is claimed in the store (INSERT of (schedule, tick) under its primary
key, in the same transaction as the concurrency check), so each tick fires exactly once.

Schedules on the Kubernetes backend are fired by their CronJob in the cluster, not here.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..backoff import Backoff
from ..model import JobSpec, JobState
from ..record import iso
from .schedules import (
    ScheduleError,
    due_tick,
    missed_deadline,
    next_tick,
    run_name,
    schedule_options,
)
from .store import ExperimentStore, TickClaim, UnknownSchedule

if TYPE_CHECKING:
    from ...runtime.payload import Payload
    from ..backend import Backend
    from ..service import JobService

log = logging.getLogger("jupyterlab_mlcluster.scheduler")

DEFAULT_INTERVAL = 10.0
MAX_BACKOFF = 60.0


class Clock:
    """Wall time, or a simulated one for tests and dry runs: `START@SPEED` (START in epoch
    seconds or ISO 8601; SPEED simulated seconds per real second, e.g. 60 = a minute a
    second). Every process given the same spec sees the same time."""

    def __init__(self, spec: str | None = None):
        self.start: float | None = None
        self.speed = 1.0  # (read only with a start)
        if spec:
            start, _, speed = spec.partition("@")
            try:
                self.start = float(start)
            except ValueError:
                import datetime

                try:
                    # Python 3.11's fromisoformat reads a "Z" suffix itself.
                    self.start = datetime.datetime.fromisoformat(start).timestamp()
                except ValueError:
                    raise ScheduleError(
                        f"--clock {spec!r}: START must be epoch or ISO 8601"
                    ) from None
            try:
                self.speed = float(speed or 1)
            except ValueError:
                raise ScheduleError(f"--clock {spec!r}: SPEED must be a number") from None
            if not self.speed > 0:
                raise ScheduleError(f"--clock {spec!r}: SPEED must be positive")

    def now(self) -> float:
        real = time.time()
        if self.start is None:
            return real
        return self.start + (real - self.start) * self.speed


def create_schedule(
    service: JobService,
    *,
    spec: JobSpec,
    payload: Payload,
    options: dict[str, Any],
    owner: str | None,
    origin: dict[str, Any],
    now: float | None = None,
) -> dict[str, Any]:
    """Validate and store a schedule (its first tick is the first after now).

    ScheduleError/SpecError/PayloadError: nothing stored."""
    opts = schedule_options(**options)
    service.backend(spec.backend).validate(spec)
    data = payload.dumps()
    store = experiments(service)
    row = dict(
        opts,
        owner=owner,
        spec=spec.to_dict(),
        origin=origin,
        created=time.time(),
        last_tick=time.time() if now is None else now,
    )
    store.insert_schedule(row, data)
    backend = service.backend(spec.backend)
    if backend.fires_schedules:
        try:
            backend.register_schedule(store.get_schedule(opts["name"]), data)
        except BaseException:
            store.delete_schedule(opts["name"])  # nothing half-registered
            raise
    return store.get_schedule(opts["name"])


def experiments(service: JobService) -> ExperimentStore:
    from .sweep import experiments as shared

    return shared(service)


class Scheduler:
    def __init__(
        self, service: JobService, clock: Clock | None = None, *, shared: bool = False
    ) -> None:
        self.service = service
        # A server shared by many users fires its users' schedules: each run is marked as a
        # job that server submitted for its owner (origin "shared"), as POST /jobs marks one,
        # so its MLflow experiment goes under the owner's name (jobs/tracking/mlflow_run.py).
        self.shared = shared
        self.store = experiments(service)
        self.clock = clock or Clock()

    def fire_due(self, now: float | None = None) -> list[dict[str, Any]]:
        """Fire every local schedule's due tick (at most one per schedule per call);
        returns what this process did (for logs and tests)."""
        now = self.clock.now() if now is None else now
        done = []
        for row in self.store.list_schedules():
            if row["suspended"] or self.service.backend(row["spec"]["backend"]).fires_schedules:
                continue  # paused, or fired by the cluster itself (a CronJob)
            after = row["last_tick"] if row["last_tick"] is not None else row["created"]
            tick = due_tick(row["cron"], row["timezone"], after, now)
            if tick is None:
                continue
            try:
                done.append(self._fire(row, tick, now))
            except Exception as exc:
                log.exception("schedule %s: firing tick %s failed", row["name"], tick)
                done.append({"schedule": row["name"], "tick": tick, "outcome": f"error: {exc}"})
        return done

    def _fire(self, row: dict[str, Any], tick: float, now: float) -> dict[str, Any]:
        name = row["name"]
        if missed_deadline(tick, now, row["starting_deadline"]):
            self.store.advance(name, tick, "missed: past its starting deadline")
            return {"schedule": name, "tick": tick, "outcome": "missed"}
        outcome, active = self.store.claim_tick(name, tick, row["concurrency"] == "Forbid")
        if outcome != TickClaim.CLAIMED:
            return {"schedule": name, "tick": tick, "outcome": outcome}
        if row["concurrency"] == "Replace":
            for job_id in active:
                self.service.cancel(job_id, wait=True)
        try:
            job_id = self._submit(row, tick)
        except Exception as exc:
            self.store.record_run(name, tick, None, f"failed to submit: {exc}")
            raise
        self.store.record_run(name, tick, job_id, "submitted")
        self.trim_history(row)
        return {"schedule": name, "tick": tick, "outcome": "submitted", "job_id": job_id}

    def _submit(self, row: dict[str, Any], tick: float) -> str:
        from ...runtime.payload import Payload

        spec = JobSpec.from_dict(row["spec"])
        spec.name = run_name(row["name"], tick, row["timezone"])
        payload = Payload.loads(self.store.payload_path(row["name"]).read_bytes())
        origin = dict(row["origin"], kind="schedule", schedule=row["name"], tick=tick)
        if row["owner"]:
            origin["user"] = row["owner"]
        if self.shared:
            origin["shared"] = True
        record = self.service.submit(spec, payload, origin=origin, cwd=origin.get("cwd"))
        return record.id

    def trim_history(self, row: dict[str, Any]) -> None:
        """Keep the newest N succeeded and M failed runs' jobs (CronJob's history limits)."""
        runs = [r for r in self.store.runs(row["name"]) if r["job_id"] and r["state"]]
        succeeded = [r["job_id"] for r in runs if r["state"] == str(JobState.SUCCEEDED)]
        failed = [
            r["job_id"]
            for r in runs
            if r["state"] in (str(JobState.FAILED), str(JobState.CANCELLED))
        ]
        extra = succeeded[row["successful_history"] :] + failed[row["failed_history"] :]
        for job_id in extra:
            self.service.cancel(job_id, purge=True)
        self.store.forget_runs(row["name"], extra)

    def run_forever(
        self,
        interval: float = DEFAULT_INTERVAL,
        stop: threading.Event | None = None,
        on_fire: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        """The daemon's loop; a failing store backs off with jitter (capped), never spins."""
        stop = stop or threading.Event()
        failures = 0
        while not stop.is_set():
            try:
                for item in self.fire_due():
                    if on_fire is not None:
                        on_fire(item)
                failures = 0
                wait = interval
            except Exception:
                failures += 1
                log.exception("scheduler pass failed (%d in a row)", failures)
                wait = pass_backoff(interval, MAX_BACKOFF, 6).delay(failures)
            stop.wait(wait)


def pass_backoff(interval: float, longest: float, doublings: int) -> Backoff:
    """How a scheduler waits after its n-th failed pass in a row (n from 1): the ceiling is
    `interval * 2**n`, at most `longest` and at most `doublings` doublings of `interval` (a
    short test interval stays short); equal jitter (floor 0.5): never sooner than half the
    ceiling, so a failing store is never retried at once, nor by every server in step."""
    return Backoff(first=interval, cap=min(longest, interval * 2**doublings), floor=0.5)


def run_json(run: dict[str, Any]) -> dict[str, Any]:
    """One claimed tick as REST shows it (times as RFC 3339, like jobs)."""
    return dict(run, tick=iso(run["tick"]), fired=iso(run["fired"]))


def next_run(row: dict[str, Any]) -> float | None:
    """The schedule's next tick (epoch seconds); None while it is paused."""
    if row["suspended"]:
        return None
    after = row["last_tick"] if row["last_tick"] is not None else row["created"]
    return next_tick(row["cron"], row["timezone"], after)


def schedule_json(service: JobService, row: dict[str, Any]) -> dict[str, Any]:
    """A schedule's REST shape: its settings, next tick, and its last run."""
    runs = experiments(service).runs(row["name"], limit=1)
    last = runs[0] if runs else None
    return {
        "name": row["name"],
        "owner": row["owner"],
        "cron": row["cron"],
        "timezone": row["timezone"],
        "concurrency": row["concurrency"],
        "starting_deadline": row["starting_deadline"],
        "successful_history": row["successful_history"],
        "failed_history": row["failed_history"],
        "suspended": row["suspended"],
        "backend": row["spec"].get("backend"),
        "workers": row["spec"].get("workers"),
        "created": iso(row["created"]),
        "next_run": iso(next_run(row)),
        "last_run": None
        if last is None
        else dict(run_json(last), job_name=run_name(row["name"], last["tick"], row["timezone"])),
    }


def _cluster_backend(service: JobService, name: str) -> Backend | None:
    """The backend that fires this schedule itself (Kubernetes), or None (local schedulers)."""
    row = experiments(service).get_schedule(name)
    backend = service.backend(row["spec"].get("backend") or "local")
    return backend if backend.fires_schedules else None


def pause(service: JobService, name: str, paused: bool) -> None:
    """Pause/resume: the cluster's CronJob first (a failure changes nothing), then the row."""
    backend = _cluster_backend(service, name)
    if backend is not None:
        backend.suspend_schedule(name, paused)
    experiments(service).set_suspended(name, paused)


def delete(service: JobService, name: str) -> None:
    backend = _cluster_backend(service, name)
    if backend is not None:
        backend.forget_schedule(name)
    experiments(service).delete_schedule(name)


__all__ = ["Clock", "Scheduler", "UnknownSchedule", "create_schedule"]
