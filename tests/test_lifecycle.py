"""The lifecycle both backends share (jobs/lifecycle.py): what a failure is called."""

from __future__ import annotations

import json
import signal

import pytest

from jupyterlab_mlcluster.jobs.lifecycle import Outcome, failure_text, format_duration
from jupyterlab_mlcluster.jobs.storage.store import JobStore


def test_failure_text_prefers_the_ranks_own_report(tmp_path):
    store = JobStore(tmp_path / "store")
    job = "jlife00001"
    store.job_dir(job).mkdir(parents=True)
    killed = Outcome("failed", failed_rank=1, exit_code=-signal.SIGKILL)
    assert failure_text(store, job, killed) == "rank 1 was killed by SIGKILL (out of memory?)"
    assert failure_text(store, job, Outcome("failed", failed_rank=0, exit_code=3)) == (
        "rank 0 exited with status 3"
    )
    pod = Outcome("failed", "pod train-worker-0 was evicted", failed_rank=0)
    assert failure_text(store, job, pod) == "pod train-worker-0 was evicted"
    store.error_path(job, 1).write_text(
        json.dumps({"exc_type": "ValueError", "message": "bad batch", "traceback": "..."})
    )
    assert failure_text(store, job, killed) == "rank 1 failed: ValueError: bad batch"
    # a report that is not one (a rank may write anything there) is ignored
    store.error_path(job, 0).write_text("[1, 2]")
    assert failure_text(store, job, pod) == "pod train-worker-0 was evicted"
    assert failure_text(store, job, Outcome("failed")) == "the job failed"


def test_format_duration():
    assert [format_duration(s) for s in (None, 5, 119, 120, 5400, 7200)] == [
        "",
        "5s",
        "119s",
        "2m",
        "90m",
        "2h",
    ]


def test_outcome_kinds_are_their_old_strings_and_an_unknown_one_is_refused():
    from jupyterlab_mlcluster.jobs.lifecycle import OutcomeKind

    assert Outcome("timeout").kind is OutcomeKind.TIMEOUT  # a backend's string still reads
    assert [k.value for k in OutcomeKind] == [
        "succeeded",
        "failed",
        "cancelled",
        "timeout",
        "restart",
    ]
    with pytest.raises(ValueError):
        Outcome("faild")
