"""mlc.log (issue 35): a rank's scalars, batched onto its signed report, kept with the job;
what a rank sends is checked again where it is stored."""

from __future__ import annotations

import json
import math
import textwrap

import pytest
from helpers import run_cli, session_cell

from jupyterlab_mlcluster.jobs.lifecycle import RankUpdates, clean_progress
from jupyterlab_mlcluster.jobs.model import JobSpec
from jupyterlab_mlcluster.jobs.storage.series import (
    NAMES_FILE,
    READ_BYTES,
    SERIES_FILE,
    SeriesWriter,
    read_all,
    read_series,
)
from jupyterlab_mlcluster.runtime.payload import Payload
from jupyterlab_mlcluster.runtime.scalars import MAX_SERIES

LOGGING = textwrap.dedent(
    """
    import os
    import jupyterlab_mlcluster as mlc
    rank = int(os.environ["RANK"])
    mlc.progress(0, 300)
    for i in range(300):
        mlc.log(loss=1.0 / (i + 1) + rank, lr=0.01)
    mlc.log(step=300, loss=float("nan"), acc="high", ok=1)
    mlc.log(step=float("inf"), loss=1.0)
    mlc.log(**{"a,b": 1.0})
    mlc.progress(300, 300)
    """
)


@pytest.mark.usefixtures("pool_mode")
def test_every_step_logged_is_kept_and_bad_values_are_said(service, store_dir):
    spec = JobSpec.from_options({"workers": 2})
    job_id = service.submit(spec, Payload(source=LOGGING)).id
    record = service.wait(job_id, timeout=120)
    assert record.state == "succeeded", record.error
    data = read_series(service.store.job_dir(job_id), None)
    assert data["names"] == ["loss", "lr", "ok"]
    got = {(s["name"], s["rank"]): s for s in data["series"]}
    for rank in (0, 1):
        loss = got[("loss", rank)]
        assert loss["steps"] == list(range(300)), "every step, in order, none twice"
        assert loss["values"][0] == 1.0 + rank and loss["values"][-1] == 1 / 300 + rank
        assert got[("ok", rank)]["steps"] == [300]
    # A log-only report moves no progress bar: the ranks' last progress is their own.
    assert [r.progress["step"] for r in record.ranks] == [300, 300]
    # The rank said what it dropped, once each; nothing of it was stored.
    text = "\n".join(line["line"] for line in service.logs(job_id, 0)[0])
    assert "mlc.log: dropped loss=nan at step 300 (not a finite number)" in text
    assert "dropped acc='high' at step 300" in text
    assert "dropped a call whose step inf is not a finite number" in text
    assert "dropped series 'a,b'" in text

    from jupyterlab_mlcluster import Job

    frame = Job(service, job_id).metrics("loss")
    assert list(frame.columns) == ["name", "rank", "step", "value", "time"]
    assert len(frame) == 600 and set(frame["name"]) == {"loss"}
    assert frame[frame["rank"] == 1]["value"].iloc[0] == 2.0

    out = run_cli("metrics", job_id)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[1].split() == [
        "loss",
        "0",
        "300",
        "299",
        "0.00333333",
        "0.00333333",
        "1",
    ]
    csv = run_cli("metrics", job_id, "--csv").stdout.splitlines()
    assert csv[0] == "name,rank,step,value,time" and len(csv) == 1 + 600 + 600 + 2
    assert csv[1].startswith("loss,0,0,1.0,")


def test_a_batch_read_again_is_kept_once(tmp_path):
    """A supervisor may read a rank's output again: a pod log re-opened from its start (the
    stream ended before the watch saw the pod end), or a new supervisor adopting the job.
    Each batch is numbered by its process; one kept before is not kept again, by this
    supervisor or the next, and a restarted rank's (another process) starts anew."""

    def report(origin: str, n: int, step: int) -> dict:
        points = [[step, 1000.0 * (step + 1), {"loss": 1.0 / (step + 1)}]]
        return clean_progress({"series": points, "batch": [origin, n]})

    def steps() -> list:
        return read_series(tmp_path, ["loss"])["series"][0]["steps"]  # rank 0's

    writer = SeriesWriter(tmp_path, print)
    updates = RankUpdates(None, series=lambda: writer)  # type: ignore[arg-type]
    stream = [report("aa", n, n) for n in range(3)]
    for progress in stream + stream:  # the whole log read twice
        updates.update(0, progress=dict(progress))
    assert steps() == [0, 1, 2]
    assert updates.pending == {}  # a series report moves no progress bar
    writer.close()

    adopting = SeriesWriter(tmp_path, print)
    updates = RankUpdates(None, series=lambda: adopting)  # type: ignore[arg-type]
    for progress in stream + [report("aa", 3, 3), report("bb", 0, 4)]:
        updates.update(0, progress=dict(progress))
    updates.update(1, progress=report("aa", 0, 9))  # another rank's numbers are its own
    updates.update(0, progress=clean_progress({"series": [[5, 6000.0, {"loss": 0.5}]]}))
    for bad in (["bb", float("inf")], ["bb", float("nan")], "bb", ["bb"], None):  # no number
        updates.update(0, progress=clean_progress({"series": [[6, 7.0, {"l": 1}]], "batch": bad}))
    adopting.close()
    assert steps() == [0, 1, 2, 3, 4, 5]
    # A batch whose number is no number is kept as an unnumbered one: each of the five.
    assert [s["steps"] for s in read_series(tmp_path, None)["series"]] == [
        [6] * 5,
        [0, 1, 2, 3, 4, 5],
        [9],
    ]


def test_the_store_keeps_only_finite_numbers_under_good_names(tmp_path):
    """What a rank sends is user code's: a rank sending records of its own (the key is in its
    payload directory) gets nothing bad stored, and each kind of drop is said once."""
    said: list[str] = []
    writer = SeriesWriter(tmp_path, said.append, max_series=3)
    batch = [
        [0, 1.0, {"loss": 1.5, "nan": math.nan, "big": math.inf, "text": "1.0", "yes": True}],
        [1, 2.0, {"loss": 1.25, "bad,name": 1.0, "": 2.0, "x" * 201: 3.0}],
        ["two", 3.0, {"loss": 1.0}],
        [math.nan, 3.0, {"loss": 1.0}],
        [2, "late", {"loss": 1.0}],  # a bad time is the store's time
        "not a point",
        [3, 4.0, {"b": 1, "c": 2, "d": 3}],  # the cap (3) is reached at "c"
        [4, 5.0, {"e": 1.0, "f": 2.0}],
    ]
    assert writer.add(0, batch) == 4
    assert writer.add(0, "not a batch") == 0
    assert writer.add(1, [[0, 1.0, {"loss": math.nan}]] * 5) == 0
    writer.close()
    stored = [json.loads(line) for line in (tmp_path / SERIES_FILE).read_text().splitlines()]
    assert len(stored) == 1
    assert [p[0] for p in stored[0]["p"]] == [0, 1, 2, 3]
    assert [p[2] for p in stored[0]["p"]] == [
        {"loss": 1.5},
        {"loss": 1.25},
        {"loss": 1.0},
        {"b": 1, "c": 2},
    ]
    assert json.loads((tmp_path / NAMES_FILE).read_text()) == ["b", "c", "loss"]
    text = "\n".join(said)
    for what in (
        "nan=nan",
        "big=inf",
        "text='1.0'",
        "yes=True",
        "'bad,name'",
        "without a finite step",
        "no point",
    ):
        assert what in text, what
    assert sum("at most 3 series" in s for s in said) == 1, "the cap is said once"
    assert sum("loss=nan" in s for s in said) == 1, "five drops of a name, said once"
    # Read back: only what was kept; a cursor resumes after it.
    data = read_series(tmp_path, ["loss"])
    assert data["series"][0]["values"] == [1.5, 1.25, 1.0]
    assert read_series(tmp_path, ["loss"], data["cursor"])["series"] == []


def test_a_rank_past_the_cap_sends_no_new_name(service):
    """The rank holds itself to the cap as well (said once on its stderr), so an eager loop
    does not fill its channel with names the store would drop."""
    source = (
        "import jupyterlab_mlcluster as mlc\nfor i in range(250):\n    mlc.log(**{f's{i}': i})\n"
    )
    job_id = service.submit(JobSpec.from_options({"workers": 1}), Payload(source=source)).id
    assert service.wait(job_id, timeout=120).state == "succeeded"
    data = read_series(service.store.job_dir(job_id), None)
    assert len(data["names"]) == MAX_SERIES == 200
    text = "\n".join(line["line"] for line in service.logs(job_id, 0)[0])
    assert text.count("a job logs at most 200 series; 's200' and any further new names") == 1
    assert "[mlcluster] a job keeps at most" not in text, "the store had nothing to drop"


WIDE = textwrap.dedent(
    """
    import os
    import jupyterlab_mlcluster as mlc
    from jupyterlab_mlcluster.runtime import reporting
    rank = int(os.environ["RANK"])
    names = [f"layer{k:02d}/grad_norm_{'x' * 20}" for k in range(30)]
    for i in range(2000):
        mlc.log(**{name: i + 0.5 for name in names})
    mlc.log(step=2000, **{"\\U0001f600" * 198 + f"{k:02d}": 1.0 for k in range(60)})
    if rank == 0:  # one record past the supervisor's line cap, twice: said once
        for _ in range(2):
            reporting.send({"type": "progress", "series": [[0, 0, {"big": 1.0}]] * 8000})
    """
)


@pytest.mark.usefixtures("pool_mode")
def test_a_tight_loop_of_wide_points_keeps_every_point(service):
    """A batch goes out by its encoded size too, under the 64 KiB line a supervisor reads
    (2000 points of 30 names made a record of megabytes that was dropped whole), and a
    point too large for one record goes in pieces; a record that cannot be read is said."""
    spec = JobSpec.from_options({"workers": 2})
    job_id = service.submit(spec, Payload(source=WIDE)).id
    assert service.wait(job_id, timeout=120).state == "succeeded"
    data = read_all(service.store.job_dir(job_id), None)
    assert len(data["names"]) == 90
    got = {(s["name"], s["rank"]): s["steps"] for s in data["series"]}
    for rank in (0, 1):
        for k in range(30):
            name = f"layer{k:02d}/grad_norm_{'x' * 20}"
            assert got[(name, rank)] == list(range(2000)), (name, rank)
        for k in range(60):
            assert got[("\U0001f600" * 198 + f"{k:02d}", rank)] == [2000]
    text = "\n".join(line["line"] for line in service.logs(job_id, 0)[0])
    assert text.count("rank 0 sent a report the supervisor could not read") == 1
    assert "big" not in data["names"]
    other = "\n".join(line["line"] for line in service.logs(job_id, 1)[0])
    assert "could not read" not in other


def test_a_job_past_max_series_mib_keeps_its_first_mib_and_says_so_once(service):
    """T1: a job's series file is capped (MLClusterConfig.max_series_mib): the first MiB of
    points is kept, one line says so, the rest is dropped and the job runs on to its end."""
    from jupyterlab_mlcluster.config import MLClusterConfig
    from jupyterlab_mlcluster.jobs.service import JobService

    capped = JobService(config=MLClusterConfig(max_series_mib=1))
    source = (
        "import jupyterlab_mlcluster as mlc\n"
        "for i in range(4000):\n"
        "    mlc.log(**{f'metric_{k:02d}': i + 0.25 for k in range(20)})\n"
        "'done'\n"
    )
    record = capped.submit(JobSpec.from_options({"workers": 1}), Payload(source=source))
    assert capped.wait(record.id, timeout=120).state == "succeeded"
    assert capped.result(record.id) == ("value", "done")
    job_dir = capped.store.job_dir(record.id)
    size = (job_dir / SERIES_FILE).stat().st_size
    assert (1 << 20) - 64 * 1024 < size <= 1 << 20, size  # about 2.7 MiB were logged
    steps = read_series(job_dir, ["metric_00"], limit=64 << 20)["series"][0]["steps"]
    assert steps == list(range(len(steps))) and 1000 < len(steps) < 4000, "the first points"
    text = "\n".join(line["line"] for line in capped.logs(record.id, 0)[0])
    assert text.count("series truncated after 1 MiB") == 1 and "max_series_mib" in text


def test_a_read_is_one_bounded_page_and_its_cursor_goes_on_to_the_end(tmp_path):
    """T1: read_series parses at most about `limit` bytes per call (a GET /jobs/{id}/metrics
    ask loaded the whole file); following the cursor brings every point, in order."""
    from jupyterlab_mlcluster.kernel.curves import Curves

    writer = SeriesWriter(tmp_path, print)
    for start in range(0, 60_000, 500):
        writer.add(start % 2, [[s, 1000.0, {"loss": s + 0.5}] for s in range(start, start + 500)])
    writer.close()
    size = (tmp_path / SERIES_FILE).stat().st_size
    assert size > 1 << 20
    cursor, pages, steps = 0, 0, []
    while True:
        page = read_series(tmp_path, ["loss"], cursor, limit=256 * 1024)
        assert page["cursor"] - cursor <= 256 * 1024, "a bounded page"
        cursor, pages = page["cursor"], pages + 1
        steps += [s for entry in page["series"] for s in entry["steps"]]
        if not page["more"]:
            break
    assert cursor == size and pages >= 6
    assert sorted(steps) == list(range(60_000))
    whole = read_all(tmp_path, None)
    assert whole["cursor"] == size and not whole["more"]
    assert sum(len(s["steps"]) for s in whole["series"]) == 60_000
    for start in range(60_000, 200_000, 500):  # past READ_BYTES: the kernel's view catches up
        writer.add(0, [[s, 1000.0, {"loss": s + 0.5}] for s in range(start, start + 500)])
    writer.close()
    assert size_of(tmp_path) > READ_BYTES
    curves = Curves(tmp_path)
    assert curves.poll() and curves.points == 200_000 and curves.cursor == size_of(tmp_path)


def size_of(job_dir) -> int:
    return (job_dir / SERIES_FILE).stat().st_size


def test_a_batch_is_read_by_columns_only_when_its_points_carry_the_same_names(tmp_path):
    """read_series takes a batch a column at a time when every point has the first point's
    names; a batch whose names vary is read point by point, and no value is lost or misplaced."""
    with open(tmp_path / SERIES_FILE, "w") as f:
        for rank, points in [
            (0, [[s, 1.0, {"loss": s + 0.5, "lr": 0.1}] for s in range(4)]),
            (1, [[0, 2.0, {"loss": 9.0}], [1, 2.0, {"loss": 8.0, "acc": 0.5}], [2, 2.0, {}]]),
            (1, [[3, 3.0, {"loss": 7.0, "lr": 1.0}], [4, 3.0, {"acc": 0.7, "lr": 2.0}]]),
        ]:
            f.write(json.dumps({"r": rank, "p": points}) + "\n")
    got = {
        (e["name"], e["rank"]): (e["steps"], e["values"])
        for e in read_all(tmp_path, None)["series"]
    }
    assert got == {
        ("loss", 0): ([0, 1, 2, 3], [0.5, 1.5, 2.5, 3.5]),
        ("lr", 0): ([0, 1, 2, 3], [0.1] * 4),
        ("loss", 1): ([0, 1, 3], [9.0, 8.0, 7.0]),
        ("acc", 1): ([1, 4], [0.5, 0.7]),
        ("lr", 1): ([3, 4], [1.0, 2.0]),
    }
    only = read_series(tmp_path, ["acc"])["series"]
    assert [(e["rank"], e["steps"]) for e in only] == [(1, [1, 4])]


def test_a_session_cells_points_are_that_cells(service):
    """A session's ranks log into the running cell's job (its monitor and GET
    /jobs/{cell}/metrics read it), not the session's: each cell keeps its own points, the
    last ones too (sent before the cell's end)."""

    from jupyterlab_mlcluster.jobs import sessions

    def cell(source: str):
        return service.wait(session_cell(service, "logs", source).id, timeout=300)

    log = "import os, jupyterlab_mlcluster as mlc\nr = int(os.environ['RANK'])\n"
    first = cell(log + "for s in range(3):\n    mlc.log(step=s, first=s + r)\n")
    second = cell(log + "mlc.log(step=0, second=10.0 + r)\n")
    try:
        assert first.state == second.state == "succeeded", (first.error, second.error)

        def series(job_id: str) -> dict:
            data = read_all(service.store.job_dir(job_id), None)
            return {(s["name"], s["rank"]): s["values"] for s in data["series"]}

        assert series(first.id) == {("first", 0): [0, 1, 2], ("first", 1): [1, 2, 3]}
        assert series(second.id) == {("second", 0): [10.0], ("second", 1): [11.0]}
        holder = service.store.session_rows(name="logs")[0]["job_id"]
        assert series(holder) == {}
    finally:
        sessions.stop_session(service, None, "logs")


def test_importing_mlc_log_leaves_no_state_nor_fork_hook():
    """The server and the supervisor import the module (series.py checks names with it) and
    never log: its buffer and fork hook are made by a rank's first call, not at import."""
    import subprocess
    import sys

    check = textwrap.dedent(
        """
        from jupyterlab_mlcluster.jobs.storage import series  # what a supervisor imports
        from jupyterlab_mlcluster.runtime import scalars
        scalars.log(loss=1.0)  # outside a job: nothing
        scalars.flush()
        print(scalars._state is None, scalars._fork_hook)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", check], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.split() == ["True", "False"], out.stdout + out.stderr
