"""A list that groups (issue 35, item 4): a session's cells under the session's job, a sweep's
trials under the sweep, in the store's listing (`parent`), the CLI's `mlcluster jobs` (and
`--flat`) and the names of jobs submitted without one."""

from __future__ import annotations

import json
import time

import pytest
from helpers import run_cli

from jupyterlab_mlcluster.jobs.grouping import TOP_LEVEL, default_name, parent_of
from jupyterlab_mlcluster.jobs.listing import grouped_jobs
from jupyterlab_mlcluster.jobs.model import JobSpec, JobState
from jupyterlab_mlcluster.jobs.record import JobRecord
from jupyterlab_mlcluster.jobs.storage.store import JobStore
from jupyterlab_mlcluster.presentation import format_job_groups

SESSION = "j5e5510000a"
SWEEP = "s5eee900001"


def add(store: JobStore, job_id: str, name: str, created: float, **origin) -> None:
    store.insert_job(
        JobRecord(
            id=job_id,
            name=name,
            spec=JobSpec(workers=1),
            created=created,
            owner="alice",
            origin={"kind": "kernel", **origin},
        )
    )
    store.transition(job_id, JobState.SUCCEEDED, started=created, finished=created + 1)


def fill(store: JobStore) -> None:
    """A plain job, a session (its job, 12 cells) and a 3-trial sweep, mixed in time."""
    t = time.time() - 1000
    add(store, "j00000000001", "plain", t)
    add(store, SESSION, "s", t + 1, session="s")
    for i in range(12):
        add(store, f"j0000000c{i:03d}", f"train-cell{i + 2}", t + 2 + i, session="s",
            session_job=SESSION, notebook="train.ipynb", cell=i + 2)  # fmt: skip
    for i in range(3):
        sweep = {"id": SWEEP, "trial": i, "parallel": None, "name": "tune-cell4"}
        add(store, f"j0000000t{i:03d}", f"tune-cell4-t{i}", t + 20 + i, sweep=sweep)


@pytest.fixture
def store(tmp_path):
    store = JobStore(tmp_path / "store")
    fill(store)
    yield store
    store.close()


def test_a_job_names_its_parent():
    assert parent_of({"session": "s", "session_job": SESSION}) == SESSION
    assert parent_of({"session": "s"}) is None  # the session's own job is at the top
    assert parent_of({"sweep": {"id": SWEEP, "trial": 0}}) == SWEEP
    assert parent_of({"kind": "kernel"}) is None


def test_the_store_lists_one_group_or_the_top_level_from_its_index(store):
    cells, total = store.list_jobs(parent=SESSION, limit=5)
    assert total == 12 and [c.name for c in cells] == [
        f"train-cell{n}" for n in (13, 12, 11, 10, 9)
    ]
    trials, total = store.list_jobs(parent=SWEEP)
    assert total == 3 and {t.id for t in trials} == {f"j0000000t{i:03d}" for i in range(3)}
    top, total = store.list_jobs(parent=TOP_LEVEL)
    assert total == 2 and [r.name for r in top] == ["s", "plain"]
    # The REST form says it too, and the filter reads the index, not every job.
    texts, _ = store.list_json(parent=SESSION, limit=1)
    assert json.loads(texts[0])["parent"] == SESSION
    db = store.database.connection
    for args in ((SESSION,), ()):
        clause = "= ?" if args else "IS NULL"
        sql = (
            "SELECT * FROM jobs WHERE COALESCE(json_extract(origin, '$.session_job'),"
            f" json_extract(origin, '$.sweep.id')) {clause} ORDER BY created DESC, id LIMIT 5"
        )
        plan = " ".join(row[3] for row in db.execute(f"EXPLAIN QUERY PLAN {sql}", args))
        assert "jobs_by_parent" in plan and "TEMP B-TREE" not in plan, plan


def test_the_grouped_listing_puts_cells_and_trials_under_their_group(store):
    groups, total = grouped_jobs(store, limit=10, shown=3)
    assert [(g.kind, g.name, g.count) for g in groups] == [
        ("sweep", "tune-cell4", 3),
        ("session", "s", 12),
        ("job", "plain", 0),
    ]
    text = format_job_groups(groups)
    lines = text.splitlines()
    assert lines[0].split()[:3] == ["ID", "NAME", "STATE"]
    assert lines[1].startswith(SWEEP) and "3 trials" in lines[1]
    assert lines[2].startswith("  j0000000t002") and "tune-cell4-t2" in lines[2]
    session_row = next(i for i, line in enumerate(lines) if line.startswith(SESSION))
    assert [line.split()[1] for line in lines[session_row + 1 : session_row + 4]] == [
        "train-cell13",
        "train-cell12",
        "train-cell11",
    ]
    assert lines[session_row + 4].split()[1:4] == ["9", "more", "cells"]
    assert lines[session_row + 4].endswith(f"mlcluster jobs --parent {SESSION}")
    assert lines[-1].startswith("j00000000001")
    assert total == 2


def test_an_unnamed_job_is_named_after_what_it_ran():
    notebook = {"kind": "kernel", "notebook": "work/Train Model.ipynb", "cell": 7}
    assert default_name("code", notebook) == "train-model-cell7"
    assert default_name("code", {"kind": "kernel", "cell": 3}) == "cell3"
    assert default_name("code", {"kind": "kernel", "notebook": "a.ipynb"}) == "a"
    assert default_name("script", {"kind": "cli"}, filename="/x/train_v2.py") == "train-v2"
    assert default_name("module", {"kind": "cli"}, filename="pkg.finetune") == "finetune"
    assert default_name("code", {"kind": "python"}) == "job"
    long = {"kind": "kernel", "notebook": "x" * 80 + ".ipynb", "cell": 123}
    name = default_name("code", long)
    assert name.endswith("-cell123") and len(name) <= 40


def test_mlcluster_jobs_groups_and_flat_lists_every_row(store_dir):
    store = JobStore(store_dir)
    fill(store)
    store.close()
    grouped = run_cli("jobs")
    assert grouped.returncode == 0, grouped.stderr
    lines = grouped.stdout.splitlines()
    assert len(lines) == 1 + 4 + 7 + 1  # header; sweep, 3 trials; session, 5 cells, "more"; plain
    assert lines[1].startswith(SWEEP) and "7 more cells" in grouped.stdout
    flat = run_cli("jobs", "--flat", "--limit", "100")
    assert flat.returncode == 0 and len(flat.stdout.splitlines()) == 1 + 17
    under = run_cli("jobs", "--parent", SESSION, "--json")
    assert under.returncode == 0
    assert {j["parent"] for j in json.loads(under.stdout)} == {SESSION}
