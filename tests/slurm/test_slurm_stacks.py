"""Where a Slurm job's ranks are (issue 33), on the real daemons (conftest.py): the folded
stacks of a hung 2-rank gloo job read by py-spy (the tasks run on this machine), the same
through the ranks' own helper woken by scancel --signal=USR2, and a stall flagged with
where the ranks were, then --on-stall cancel."""

from __future__ import annotations

import json
import textwrap

import pytest
from helpers import wait_for
from workloads import HANG

from jupyterlab_mlcluster.jobs import forensics
from jupyterlab_mlcluster.jobs.model import JobSpec, JobState
from jupyterlab_mlcluster.runtime.payload import Payload

SLEEPERS = textwrap.dedent(
    """\
    import time

    def wait_here():
        time.sleep(600)

    print("ready", flush=True)
    wait_here()
    """
)


def _service(slurm_store, tmp_path, **settings):
    from jupyterlab_mlcluster.jobs.service import JobService

    path = tmp_path / "jupyter-config" / "jupyter_mlcluster_config.json"
    config = json.loads(path.read_text())
    config["MLClusterConfig"].update(settings)
    path.write_text(json.dumps(config))
    return JobService()


@pytest.fixture
def services(slurm_store, tmp_path):
    made = []

    def make(**settings):
        made.append(_service(slurm_store, tmp_path, **settings))
        return made[-1]

    yield make
    for svc in made:
        for record in svc.store.list_jobs()[0]:
            if not record.final:
                svc.cancel(record.id)


def _submit(service, code: str, **options) -> str:
    spec = JobSpec.from_options({"backend": "slurm", **options})
    return service.submit(spec, Payload(kind="code", source=code)).id


def _ready(service, job: str, ranks: int) -> None:
    def all_said() -> bool:
        record = service.get(job)
        assert not record.final, (record.state, record.error, record.reason)
        lines, _ = service.logs(job)
        return len({line["rank"] for line in lines if line["line"] == "ready"}) == ranks

    wait_for(all_said, timeout=180, message=f"{ranks} ranks ready")


def _hung_stacks(service, job: str) -> forensics.StackReport:
    def folded():
        report = service.stacks(job)
        text = "\n".join(forensics.fold_lines(report, main_only=True))
        return report if "all_reduce" in text and "time.sleep" in text else None

    return wait_for(folded, timeout=60, message="rank 0 inside all_reduce, rank 1 asleep")


def test_a_hung_gloo_jobs_stacks_by_py_spy_fold_by_rank(services):
    service = services()
    job = _submit(service, HANG, workers=2)
    _ready(service, job, 2)
    report = _hung_stacks(service, job)
    assert report.complete and report.readers == ["py-spy"]
    lines = forensics.fold_lines(report, main_only=True)
    assert "rank 0: all_reduce ← train_step (cell.py:8): dist.all_reduce(t)" in lines
    assert "rank 1: <module> (cell.py:12): time.sleep(600)" in lines
    assert {r.pid for r in report.ranks} == {r.pid for r in service.get(job).ranks}
    one = service.stacks(job, rank=1)
    assert [r.rank for r in one.ranks] == [1]
    record = service.cancel(job)
    assert record.state == JobState.CANCELLED
    # The ranks' stacks were taken before they were stopped, and kept.
    assert "rank 0 was in all_reduce" in record.reason, record.reason
    kept = forensics.kept(service.store.job_dir(job))
    assert [k.why for k in kept] == ["cancelled"] and {r.rank for r in kept[0].ranks} == {0, 1}


def test_the_ranks_own_helper_answers_through_scancel_and_says_so(services):
    service = services(stacks_reader="helper")
    job = _submit(service, HANG, workers=2)
    _ready(service, job, 2)
    report = _hung_stacks(service, job)
    assert report.complete, report.missing
    assert all(
        r.reader.startswith("faulthandler (the rank's own helper) via scancel")
        for r in report.ranks
    )
    lines = forensics.fold_lines(report, main_only=True)
    assert any(line.startswith("rank 0: all_reduce ← train_step (cell.py:8)") for line in lines)
    # Both ranks are still there: SIGUSR2 woke their helpers, it did not end them.
    assert {r.state for r in service.get(job).ranks} == {"running"}
    service.cancel(job)


def test_a_stall_is_flagged_with_where_then_on_stall_cancel_ends_the_job(services):
    service = services()
    job = _submit(service, SLEEPERS, workers=2, framework="none", stall_after="3s")
    _ready(service, job, 2)
    record = wait_for(
        lambda: (r := service.get(job)).stall and len(r.stall["ranks"]) == 2 and r,
        timeout=60,
        message="the stall flagged",
    )
    view = record.to_json()["stall"]
    assert view["ranks"] == [0, 1] and view["since"]
    assert view["where"] == ["ranks 0, 1: wait_here (cell.py:4): time.sleep(600)"]
    # Kept as each stall was seen (a rank that said "ready" later may be seen a turn later).
    assert {k.why for k in forensics.kept(service.store.job_dir(job))} == {"stalled"}
    # It stays flagged: a sleeping rank's own CPU reports (its reporter thread, 0.5-1 %)
    # are not taken for activity (they were, at the local 1 %: the stall came and went).
    seen = []

    def more_samples():
        seen.append(service.get(job).stall["ranks"])
        return len(seen) >= 8

    wait_for(more_samples, timeout=60, interval=1.0, message="later looks")
    assert all(ranks == [0, 1] for ranks in seen), seen
    lines, _ = service.logs(job)
    assert not any("no rank is stalled any more" in line["line"] for line in lines)
    service.cancel(job)

    job = _submit(
        service, SLEEPERS, workers=2, framework="none", stall_after="3s", on_stall="cancel"
    )
    record = wait_for(
        lambda: (r := service.get(job)).final and r, timeout=240, message="the job's end"
    )
    assert record.state == JobState.CANCELLED
    assert record.reason.startswith("cancelled (--on-stall cancel): rank"), record.reason
    assert "stalled: no output, progress or CPU for 3s" in record.reason
    assert "wait_here (cell.py:4)" in record.reason


SLOW_RANK = textwrap.dedent(
    """\
    import os, time
    import jupyterlab_mlcluster as mlc

    pause = 0.6 if os.environ["RANK"] == "1" else 0.1
    print("ready", flush=True)
    for step in range(100000):
        mlc.progress(step, desc="train")
        mlc.log(loss=1.0 / (step + 1))
        time.sleep(pause)
    """
)


def test_a_straggler_is_named_from_the_ranks_progress_on_slurm_too(services):
    """The rule lives in the supervisor (jobs/), fed by each progress report it stores: a
    Slurm rank's reports (its control file) name it as a local rank's do."""
    service = services(straggler_after=3)
    job = _submit(service, SLOW_RANK, workers=2, framework="none")

    def named():
        record = service.get(job)
        assert not record.final, (record.state, record.error)
        return record if record.straggler else None

    record = wait_for(named, timeout=180, message="the straggler named")
    view = record.to_json()["straggler"]
    assert view["ranks"] == [1], view
    assert view["median"] > 2 * view["rates"]["1"] > 0
    # mlc.log's points come through a Slurm rank's control file too (issue 35).
    from jupyterlab_mlcluster.jobs.storage.series import read_series

    def logged():
        series = read_series(service.store.job_dir(job), ["loss"])["series"]
        return len(series) == 2 and all(s["steps"][:2] == [0, 1] for s in series)

    wait_for(logged, timeout=30, message="both ranks' series")
    service.cancel(job)
