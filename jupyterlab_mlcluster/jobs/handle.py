"""`Job`: the handle users get from submit(), `%%distributed --no-wait` and the magics."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .model import JobState
from .record import JobRecord
from .service import JobService

if TYPE_CHECKING:
    from IPython.lib.pretty import RepresentationPrinter


class Job:
    def __init__(self, service: JobService, job_id: str):
        self._service = service
        self.id = job_id

    def __repr__(self) -> str:
        record = self.record
        return (
            f"<Job {record.id} {record.name!r} {record.state} "
            f"({record.spec.workers} ranks, {record.backend})>"
        )

    @property
    def record(self) -> JobRecord:
        return self._service.store.get_job(self.id)

    @property
    def name(self) -> str:
        return self.record.name

    @property
    def status(self) -> str:
        """queued, starting, running, succeeded, failed or cancelled."""
        return str(self._service.get(self.id).state)

    @property
    def done(self) -> bool:
        return self._service.get(self.id).final

    def wait(self, timeout: float | None = None) -> Job:
        """Block until the job ends. Raises JobFailed / JobCancelled if it did not succeed,
        TimeoutError if `timeout` seconds pass first."""
        record = self._service.wait(self.id, timeout=timeout)
        if not record.final:
            raise TimeoutError(f"job {self.id} is still {record.state} after {timeout} s")
        self._service.raise_for_state(record)
        return self

    @property
    def result(self) -> Any:
        """Rank 0's result: the return value (function), the value of the cell's last
        expression, or a dict of the --pull variables. None if there is none."""
        record = self._service.get(self.id)
        if record.state != JobState.SUCCEEDED:
            if not record.final:
                raise RuntimeError(f"job {self.id} is still {record.state}; call .wait() first")
            self._service.raise_for_state(record)
        return self._service.result(self.id)[1]

    def logs(self, rank: int | None = None) -> str:
        """Everything the ranks printed so far, each line prefixed with its rank."""
        from .log_text import logs_text

        lines, _ = self._service.logs(self.id, rank)
        return logs_text(lines)

    def metrics(self, *names: str) -> Any:
        """The series the job logged (all, or those named): a pandas DataFrame with columns
        name, rank, step, value, time (epoch seconds), one row per point, when pandas is
        installed; else the same rows as a list of dicts."""
        from .storage.series import point_rows, read_all

        data = read_all(self._service.store.job_dir(self.id), list(names) or None)
        columns = ("name", "rank", "step", "value", "time")
        rows = point_rows(data)
        try:
            import pandas  # type: ignore[import-untyped]
        except ImportError:
            return [dict(zip(columns, row, strict=True)) for row in rows]
        return pandas.DataFrame(rows, columns=list(columns))

    def cancel(self) -> Job:
        self._service.cancel(self.id)
        return self

    def _repr_pretty_(self, p: RepresentationPrinter, cycle: bool) -> None:  # IPython
        p.text(repr(self))
