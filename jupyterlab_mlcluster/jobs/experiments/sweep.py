"""Sweeps on the one job model: every trial is an ordinary job, grouped under its sweep.

submit_sweep() expands the sweep (nothing is stored if it is bad), then submits one gang job
per trial with the trial's parameters pushed (cells) or appended as `--name=value`
(scripts). At most `parallel` trials run at once: each trial's supervisor waits in
wait_for_slot() (a claim in the store, in trial order) before its backend admits it, so a
queued trial holds nothing and is never partially admitted. `Sweep` is the user's handle.
"""

from __future__ import annotations

import dataclasses
import functools
import html
import secrets
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..grouping import default_name
from ..model import JobSpec, JobState
from ..record import iso
from .store import ExperimentStore
from .sweeps import SweepSpec, best_index, expand, format_value, is_score, metric_of

if TYPE_CHECKING:
    from IPython.lib.pretty import RepresentationPrinter

    from ...runtime.payload import Payload
    from ..running.supervisor import JobContext
    from ..service import JobService

SLOT_POLL = 0.2


def new_sweep_id() -> str:
    return "s" + secrets.token_hex(5)


@functools.lru_cache(maxsize=16)
def _experiment_store(db_path: str, root: str) -> ExperimentStore:
    return ExperimentStore(db_path, root)


def experiments(service: JobService) -> ExperimentStore:
    """The sweeps' and schedules' store beside a service's job store (one per store and
    process; its connections are per thread)."""
    return _experiment_store(str(service.store.db_path), str(service.store.root))


def trial_payload(payload: Payload, params: dict[str, Any]) -> Payload:
    """The trial's copy of the payload: params defined as globals (cells, functions) and
    passed as `--name=value` arguments (scripts, modules)."""
    import copy

    trial = copy.copy(payload)
    trial.push = {**payload.push, **params}
    if payload.kind in ("script", "module"):
        trial.argv = [*payload.argv, *(f"--{k}={v}" for k, v in params.items())]
    return trial


def submit_sweep(
    service: JobService,
    spec: JobSpec,
    payload: Payload,
    sweep: SweepSpec,
    *,
    origin: dict[str, Any],
    **submit_kwargs: Any,
) -> Sweep:
    """Store the sweep and submit its trials. SpecError/PayloadError before the first
    submit: nothing stored."""
    from ..owner import current_user

    clash = sorted(set(payload.push) & {p.name for p in sweep.params})
    if clash:
        from .sweeps import SweepError

        raise SweepError(f"{clash[0]} is both pushed and swept; sweep it or push it, not both")
    trials = expand(sweep)
    service.backend(spec.backend).validate(spec)
    # Every trial's payload must travel before anything is stored.
    for params in trials:
        trial_payload(payload, params).dumps()
    sweep_id = new_sweep_id()
    # Named as a job without --name would be (its notebook and cell, its script), so the
    # sweep and its trials (<base>-t<i>) say what they ran.
    base = (
        spec.name
        or default_name(payload.kind, origin, filename=payload.filename, function=payload.function)
    )[:44].rstrip("-")
    owner = origin.get("user") or current_user()
    store = experiments(service)
    store.insert_sweep(sweep_id, base, owner, sweep.to_dict(), origin)
    submitted: list[str] = []
    try:
        for index, params in enumerate(trials):
            trial_spec = JobSpec.from_dict(spec.to_dict())
            trial_spec.name = f"{base}-t{index}"
            trial_origin = dict(
                origin,
                sweep={
                    "id": sweep_id,
                    "trial": index,
                    "parallel": sweep.parallel,
                    "name": base,
                },
            )
            record = service.submit(
                trial_spec, trial_payload(payload, params), origin=trial_origin, **submit_kwargs
            )
            submitted.append(record.id)
            store.add_trial(sweep_id, index, record.id, params)
        return sweep_handle(service, sweep_id)  # in the try: an interrupt up to here cancels it all
    except BaseException:
        # Interrupted or failed half-way: no trial of a sweep that was not wholly submitted
        # may run on (the store knows every job of the sweep, even one whose submit was cut
        # short after storing it).
        for job_id in sorted(set(submitted) | set(store.jobs_of_sweep(sweep_id))):
            service.cancel(job_id, wait=False)
        raise


def sweep_handle(service: JobService, sweep_id: str) -> Sweep:
    """The sweep as its owner's kernel or CLI sees it: trial values are the real objects."""
    return Sweep(service, sweep_id, service.result)


def wait_for_slot(ctx: JobContext) -> bool:
    """In a trial's supervisor, before its backend runs: wait for a slot of the sweep.
    True to go on; False if the job was cancelled meanwhile (the caller ends it)."""
    sweep = ctx.job.origin.get("sweep")
    if not sweep:
        return True
    store = ExperimentStore.for_jobs(ctx.store)
    while True:
        if ctx.cancelled():
            return False
        why = store.try_take_slot(sweep["id"], ctx.job.id, sweep.get("parallel"))
        if why is None:
            ctx.set_reason(None)
            return True
        ctx.set_reason(why)
        ctx.tick()
        time.sleep(SLOT_POLL)


@dataclasses.dataclass
class Trial:
    index: int
    params: dict[str, Any]
    job_id: str
    state: str
    value: Any = None  # rank 0's value (the cell's last expression) or the pulled variables
    metric: Any = None  # the named metric, or the value itself when no --metric
    error: str | None = None
    duration: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "trial": self.index,
            "params": {k: _jsonable(v) for k, v in self.params.items()},
            "job_id": self.job_id,
            "state": self.state,
            "metric": self.metric if is_score(self.metric) else None,
            "error": self.error,
            "duration": self.duration,
        }


class Sweep:
    """A sweep's handle: `.trials`, `.best`, `.wait()`, `.cancel()`; its repr is the table.

    `read_value(job_id) -> (kind, value)` reads a trial's result: the owner's kernel or CLI
    passes `service.result` (the real objects, unpickled: see sweep_handle()); a server
    passes `service.result_data` (the JSON form only; it never unpickles what a job wrote)."""

    def __init__(
        self, service: JobService, sweep_id: str, read_value: Callable[[str], tuple[str, Any]]
    ) -> None:
        self._service = service
        self.id = sweep_id
        self._read_value = read_value
        self._values: dict[str, Any] = {}

    @property
    def info(self) -> dict[str, Any]:
        return experiments(self._service).get_sweep(self.id)

    @property
    def job_ids(self) -> list[str]:
        return [t["job_id"] for t in experiments(self._service).trials(self.id)]

    @property
    def trials(self) -> list[Trial]:
        options = self.info["options"]
        out = []
        for row in experiments(self._service).trials(self.id):
            state = JobState(row["state"])
            trial = Trial(row["trial"], row["params"], row["job_id"], str(state))
            if row["started"] is not None:
                trial.duration = (row["finished"] or time.time()) - row["started"]
            if state == JobState.SUCCEEDED:
                trial.value = self._value(row["job_id"])
                trial.metric = metric_of(trial.value, options.get("metric"))
            elif state.final:
                trial.error = row["error"] or row["reason"]
            out.append(trial)
        return out

    def _value(self, job_id: str) -> Any:
        if job_id not in self._values:
            try:
                self._values[job_id] = self._read_value(job_id)[1]
            except Exception as exc:  # noqa: BLE001 - an unreadable result is shown, not raised
                self._values[job_id] = f"<result not readable: {exc}>"
        return self._values[job_id]

    @property
    def best(self) -> Trial | None:
        """The succeeded trial with the best metric (--mode min or max), or None."""
        trials = [t for t in self.trials if t.state == "succeeded"]
        index = best_index([t.metric for t in trials], self.info["options"].get("mode", "min"))
        return None if index is None else trials[index]

    @property
    def done(self) -> bool:
        return all(JobState(t.state).final for t in self.trials)

    def wait(self, timeout: float | None = None) -> Sweep:
        deadline = None if timeout is None else time.monotonic() + timeout
        for job_id in self.job_ids:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not self._service.wait(job_id, timeout=left).final:
                raise TimeoutError(f"sweep {self.id} is still running after {timeout} s")
        return self

    def cancel(self) -> Sweep:
        """Stop every trial: all cancel requests first (nothing new starts), then wait."""
        ids = self.job_ids
        for job_id in ids:
            self._service.cancel(job_id, wait=False)
        for job_id in ids:
            self._service.cancel(job_id, wait=True)
        return self

    def to_json(self) -> dict[str, Any]:
        info = self.info
        trials = self.trials
        best = self.best
        states = [t.state for t in trials]
        return {
            "id": self.id,
            "name": info["name"],
            "owner": info["owner"],
            "created": iso(info["created"]),
            "state": sweep_state(states),
            **info["options"],
            "best": None if best is None else best.index,
            "trials": [t.to_json() for t in trials],
        }

    # -- display ------------------------------------------------------------------------

    def __repr__(self) -> str:
        return format_trials_text(self.id, self.info["options"], self.trials, self.best)

    def _repr_pretty_(self, p: RepresentationPrinter, cycle: bool) -> None:
        p.text(repr(self))

    def _repr_html_(self) -> str:
        return format_trials_html(self.id, self.info["options"], self.trials, self.best)


def sweep_state(states: list[str]) -> str:
    """running while any trial is not final; else succeeded if any trial succeeded."""
    if not states:
        return "queued"
    if any(not JobState(s).final for s in states):
        return "running" if any(s in ("starting", "running") for s in states) else "queued"
    if all(s == "cancelled" for s in states):
        return "cancelled"
    return "succeeded" if "succeeded" in states else "failed"


def _jsonable(value: Any) -> Any:
    return value if isinstance(value, (int, float, str, bool)) or value is None else repr(value)


def _score_text(trial: Trial) -> str:
    if trial.state == "succeeded":
        return "" if trial.metric is None else format_value(trial.metric)
    return trial.error or ""


def _duration_text(seconds: float | None) -> str:
    if seconds is None:
        return ""
    return f"{seconds:.1f}s" if seconds < 60 else f"{int(seconds) // 60}m{int(seconds) % 60:02d}s"


def format_trials_text(
    sweep_id: str, options: dict[str, Any], trials: list[Trial], best: Trial | None
) -> str:
    names = list(options.get("params", {}))
    metric = options.get("metric") or "value"
    head = ["TRIAL", *names, "STATE", metric.upper(), "DURATION", "JOB"]
    rows = [head]
    for t in trials:
        mark = "*" if best is not None and t.index == best.index else ""
        rows.append(
            [
                f"{t.index}{mark}",
                *(format_value(t.params.get(n)) for n in names),
                t.state,
                _score_text(t)[:60],
                _duration_text(t.duration),
                t.job_id,
            ]
        )
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(head))]
    lines = [
        "  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=False)).rstrip() for r in rows
    ]
    counts: dict[str, int] = {}
    for t in trials:
        counts[t.state] = counts.get(t.state, 0) + 1
    summary = ", ".join(f"{n} {s}" for s, n in counts.items())
    title = f"Sweep {sweep_id}: {len(trials)} trials ({summary})"
    if best is not None:
        title += f"; best trial {best.index} ({options.get('mode', 'min')} {metric})"
    return "\n".join([title, *lines])


def format_trials_html(
    sweep_id: str, options: dict[str, Any], trials: list[Trial], best: Trial | None
) -> str:
    names = list(options.get("params", {}))
    metric = options.get("metric") or "value"
    th = "".join(
        f"<th style='text-align:left;padding:2px 10px 2px 0'>{html.escape(h)}</th>"
        for h in ["trial", *names, "state", metric, "duration", "job"]
    )
    rows = []
    for t in trials:
        is_best = best is not None and t.index == best.index
        cells = [
            f"{t.index}{' ★' if is_best else ''}",
            *(html.escape(format_value(t.params.get(n))) for n in names),
            f"<span class='mlc-state mlc-state-{t.state}'>{t.state}</span>",
            html.escape(_score_text(t)[:120]),
            _duration_text(t.duration),
            f"<code title='%distributed_attach {t.job_id}'>{t.job_id}</code>",
        ]
        td = "".join(f"<td style='padding:2px 10px 2px 0'>{c}</td>" for c in cells)
        weight = " style='font-weight:600'" if is_best else ""
        rows.append(
            f"<tr class='mlc-trial' data-trial='{t.index}' data-state='{t.state}'{weight}>{td}</tr>"
        )
    title = html.escape(format_trials_text(sweep_id, options, trials, best).splitlines()[0])
    return (
        f"<div class='mlcluster-sweep'><div><b>{title}</b></div>"
        f"<table style='border-collapse:collapse'><thead><tr>{th}</tr></thead>"
        f"<tbody>{''.join(rows)}</tbody></table></div>"
    )
