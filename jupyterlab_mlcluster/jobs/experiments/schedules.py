"""Scheduled trainings, the pure part: validate a schedule, find its due tick, name its runs.

Policies mean what they mean on a Kubernetes CronJob (so the same schedule behaves the same
locally and as a real CronJob): `concurrency` Allow / Forbid / Replace, a starting deadline
past which a missed tick is skipped, history limits, a time zone. Cron parsing is croniter's.
"""

from __future__ import annotations

import datetime
import zoneinfo
from typing import Any

from croniter import croniter

from ... import patterns
from ..model import SpecError, parse_duration

CONCURRENCY = ("Allow", "Forbid", "Replace")
_NAME_RE = patterns.regex(patterns.SCHEDULE_NAME)  # + "-YYYYMMDDHHMM" <= 53
RUN_TIME_FORMAT = "%Y%m%d%H%M"


class ScheduleError(SpecError):
    """A schedule that cannot be registered as given; nothing is stored."""


def check_name(name: str) -> str:
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
        raise ScheduleError(
            f"schedule name must be 1-40 lowercase letters, digits or '-', starting and ending "
            f"with a letter or digit (runs are named <schedule>-<time>), got {name!r}"
        )
    return name


def check_cron(expr: str) -> str:
    """Five fields (or an @hourly-style macro), as a Kubernetes CronJob takes them."""
    expr = " ".join(str(expr or "").split())
    if not expr:
        raise ScheduleError('--cron needs an expression such as "0 2 * * *"')
    if not expr.startswith("@") and len(expr.split(" ")) != 5:
        raise ScheduleError(
            f"cron expression {expr!r} must have five fields: minute hour day month weekday"
        )
    if not croniter.is_valid(expr):
        raise ScheduleError(f"cron expression {expr!r} is not valid")
    return expr


def check_timezone(name: str | None) -> str:
    name = name or "UTC"
    try:
        zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        raise ScheduleError(
            f"unknown time zone {name!r} (an IANA name like Europe/Paris)"
        ) from None
    return name


def schedule_options(
    *,
    name: str,
    cron: str,
    timezone: str | None = None,
    concurrency: str | None = None,
    starting_deadline: Any = None,
    successful_history: Any = None,
    failed_history: Any = None,
) -> dict[str, Any]:
    """Validated schedule settings (the columns of a schedule row, less spec and owner)."""
    policy = concurrency or "Allow"
    match = [c for c in CONCURRENCY if c.lower() == str(policy).lower()]
    if not match:
        raise ScheduleError(f"--concurrency must be Allow, Forbid or Replace, got {policy!r}")
    deadline = None
    if starting_deadline not in (None, ""):
        try:
            deadline = parse_duration(starting_deadline)
        except SpecError as exc:
            raise ScheduleError(str(exc).replace("timeout", "--starting-deadline")) from None
    return {
        "name": check_name(name),
        "cron": check_cron(cron),
        "timezone": check_timezone(timezone),
        "concurrency": match[0],
        "starting_deadline": deadline,
        "successful_history": _count("--successful-history", successful_history, 3),
        "failed_history": _count("--failed-history", failed_history, 1),
    }


def _count(option: str, value: Any, default: int) -> int:
    if value in (None, ""):
        return default
    try:
        number = int(str(value))
    except ValueError:
        raise ScheduleError(f"{option} must be a whole number, got {value!r}") from None
    if number < 0:
        raise ScheduleError(f"{option} must not be negative, got {value!r}")
    return number


def _iter(cron: str, timezone: str, start: float) -> croniter:
    tz = zoneinfo.ZoneInfo(timezone)
    return croniter(cron, datetime.datetime.fromtimestamp(start, tz))


def next_tick(cron: str, timezone: str, after: float) -> float:
    """The first tick strictly after `after` (epoch seconds)."""
    return float(_iter(cron, timezone, after).get_next(float))


def due_tick(cron: str, timezone: str, after: float, now: float) -> float | None:
    """The latest tick in (after, now], or None. Older missed ticks are not run one by one:
    like a CronJob, a scheduler that was away runs (at most) the most recent one."""
    latest = float(_iter(cron, timezone, now).get_prev(float))  # strictly before `now`
    following = next_tick(cron, timezone, latest)
    if following <= now:  # `now` is itself a tick
        latest = following
    return latest if latest > after else None


def run_name(schedule: str, tick: float, timezone: str) -> str:
    """`<schedule>-<time>`: e.g. nightly-202611230200 (the tick in the schedule's zone)."""
    when = datetime.datetime.fromtimestamp(tick, zoneinfo.ZoneInfo(timezone))
    return f"{schedule}-{when.strftime(RUN_TIME_FORMAT)}"


def missed_deadline(tick: float, now: float, deadline: float | None) -> bool:
    return deadline is not None and now - tick > deadline
