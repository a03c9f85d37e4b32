"""Job ids as the store takes them: anything else is refused before it gets near a path or
a query."""

from __future__ import annotations

from ..model import JOB_ID_RE


class UnknownJob(KeyError):
    """No job with that id (or the id is not a valid job id at all)."""

    def __str__(self) -> str:
        return f"no job {self.args[0]!r}"


def check_job_id(job_id: str) -> str:
    """Refuse anything that is not a job id before it gets near a path or a query."""
    if not isinstance(job_id, str) or not JOB_ID_RE.fullmatch(job_id):
        raise UnknownJob(job_id)
    return job_id
