"""The pure half of job forensics (issue 33): folding stacks by rank, their one-line
summaries, faulthandler's text, kept reports, and the stall rule's clock."""

from __future__ import annotations

import pytest

from jupyterlab_mlcluster.jobs import forensics
from jupyterlab_mlcluster.jobs.forensics.readers import parse_faulthandler, parse_py_spy
from jupyterlab_mlcluster.jobs.forensics.stall import StallWatch
from jupyterlab_mlcluster.jobs.model import JobSpec, SpecError

C10D = "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py"
RUNTIME = "/venv/lib/python3.11/site-packages/jupyterlab_mlcluster/runtime/user_code.py"


def _frames(*items):
    return [forensics.Frame(name, file, line, code=code) for name, file, line, code in items]


def _rank(rank, frames, thread="MainThread", main=True):
    return forensics.RankStacks(
        rank, 100 + rank, "py-spy", [forensics.ThreadStack(thread, rank, frames, main=main)]
    )


WAITING = _frames(
    ("all_reduce", C10D, 3252, ""),
    ("train_step", "/home/u/train.py", 42, "dist.all_reduce(t)"),
    ("<module>", "/home/u/train.py", 50, "train_step(x)"),
    ("run_payload", RUNTIME, 60, ""),
)
SLEEPING = _frames(
    ("<module>", "<cell>", 9, ""),
    ("run_payload", RUNTIME, 60, ""),
)


def test_identical_stacks_fold_and_name_their_ranks():
    report = forensics.StackReport(
        "j1", [_rank(0, WAITING), _rank(1, SLEEPING), _rank(2, WAITING), _rank(3, WAITING)]
    )
    assert forensics.fold_lines(report) == [
        "ranks 0, 2, 3: all_reduce ← train_step (train.py:42): dist.all_reduce(t)",
        "rank 1: <module> (<cell> line 9)",
    ]
    assert forensics.where_text(report, still=True) == (
        "ranks 0, 2, 3 were still in all_reduce ← train_step (train.py:42): dist.all_reduce(t)"
        "; rank 1 was still in <module> (<cell> line 9)"
    )
    data = report.to_json()
    assert data["complete"] is True and data["readers"] == ["py-spy"]
    assert [f["ranks"] for f in data["folds"]] == [[0, 2, 3], [1]]
    assert len(data["ranks"]) == 4 and data["ranks"][1]["threads"][0]["frames"][0]["line"] == 9


def test_a_report_says_which_ranks_it_lacks_and_never_looks_whole():
    report = forensics.StackReport("j1", [_rank(0, WAITING)], missing={1: "py-spy: refused"})
    assert not report.complete
    text = forensics.format_report(report)
    assert "INCOMPLETE: rank 1: py-spy: refused" in text
    assert forensics.fold_lines(report)[-1] == "rank 1: not read (py-spy: refused)"
    assert report.to_json()["missing"] == [{"rank": 1, "why": "py-spy: refused"}]


def test_other_threads_fold_apart_from_main_threads_and_round_trip(tmp_path):
    worker = _frames(("wait", "/usr/lib/python3.11/threading.py", 320, ""))
    ranks = [_rank(0, WAITING), _rank(1, WAITING)]
    for r in ranks:
        r.threads.append(forensics.ThreadStack("loader", 7, worker, main=False))
    report = forensics.StackReport("j1", ranks, why="stalled")
    folds = report.folds()
    assert [(f.ranks, f.main) for f in folds] == [([0, 1], True), ([0, 1], False)]
    assert folds[1].label == "ranks 0, 1 (thread loader)"
    forensics.keep(tmp_path, report)
    forensics.keep(tmp_path, forensics.StackReport("j1", [_rank(0, SLEEPING)], why="cancelled"))
    kept = forensics.kept(tmp_path)
    assert [k.why for k in kept] == ["stalled", "cancelled"] and not kept[0].live
    assert kept[0].to_json()["folds"] == report.to_json()["folds"]


def test_faulthandler_text_is_read_with_its_main_thread():
    text = (
        "Thread 0x00007f0000000002 (most recent call first):\n"
        '  File "/usr/lib/python3.11/threading.py", line 320 in wait\n'
        '  File "/home/u/train.py", line 10 in loader\n'
        "\n"
        "Current thread 0x00007f0000000001 (most recent call first):\n"
        '  File "/home/u/train.py", line 3 in spin\n'
        '  File "/home/u/train.py", line 7 in <module>\n'
    )
    threads = parse_faulthandler(text, main_ident=0x7F0000000001)
    assert [t.name for t in threads] == ["MainThread", "thread 0x00007f0000000002"]
    assert [(f.name, f.line) for f in threads[0].frames] == [("spin", 3), ("<module>", 7)]
    assert forensics.summarize(threads[0].frames) == "spin (train.py:3)"


def test_py_spy_json_marks_native_frames_and_the_main_thread():
    text = (
        '[{"pid": 5, "thread_id": 1, "thread_name": null, "os_thread_id": 5, "active": true,'
        ' "owns_gil": true, "frames": [{"name": "clock_nanosleep", "filename": "libc.so.6",'
        ' "line": 0}, {"name": "f", "filename": "<cell>", "line": 3}]}]'
    )
    (thread,) = parse_py_spy(text, 5)
    assert thread.main and thread.gil and thread.active
    assert [f.native for f in thread.frames] == [True, False]
    assert forensics.summarize(thread.frames) == "f (<cell> line 3)"


def test_the_stall_rule_counts_output_progress_and_cpu():
    clock = [0.0]
    watch = StallWatch(10, clock=lambda: clock[0])
    for rank in (0, 1):
        watch.active(rank)
    clock[0] = 9.0
    watch.cpu(0, 55.0)  # computing: active
    watch.cpu(1, 0.0)  # nothing
    assert watch.check([0, 1]) is None  # nobody stalled yet: no change
    clock[0] = 10.5
    assert watch.check([0, 1]) == {1: 0.0}
    assert watch.check([0, 1]) is None  # the same stall is said once
    watch.active(1)  # it printed
    assert watch.check([0, 1]) == {}
    off = StallWatch(0, clock=lambda: clock[0])
    clock[0] = 1e9
    assert not off.enabled and off.check([0]) is None


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({"stall_after": "90s"}, (90.0, "warn")),
        ({"stall_after": 0}, (0.0, "warn")),
        ({"stall_after": "0", "on_stall": "cancel"}, (0.0, "cancel")),
        ({}, (None, "warn")),
    ],
)
def test_stall_options(options, expected):
    spec = JobSpec.from_options(options)
    assert (spec.stall_after, spec.on_stall) == expected


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"stall_after": "soon"}, "stall_after must be a duration"),
        ({"stall_after": -5}, "stall_after must be a duration"),
        ({"on_stall": "explode"}, "on_stall must be one of warn, cancel"),
    ],
)
def test_bad_stall_options_are_refused(options, message):
    with pytest.raises(SpecError, match=message):
        JobSpec.from_options(options)


def _stalled_job(state="running"):
    from jupyterlab_mlcluster.jobs.model import JobState
    from jupyterlab_mlcluster.jobs.record import JobRecord

    return JobRecord(
        id="jstall00001",
        name="train",
        spec=JobSpec(workers=4, stall_after=60.0),
        state=JobState(state),
        created=10.0,
        started=20.0,
        owner="alice",
        stall={"ranks": [1, 3], "since": 40.0, "where": ["rank 1: <module> (cell.py:9)"]},
    )


def test_a_stall_reads_in_the_jobs_table_the_monitor_rest_and_metrics():
    from jupyterlab_mlcluster.kernel.job_html import message_html, status_line
    from jupyterlab_mlcluster.presentation import stall_text
    from jupyterlab_mlcluster.server.metrics import build_metrics

    job = _stalled_job()
    assert stall_text(job.stall, now=340.0) == (
        "STALLED ranks 1, 3 for 5m: rank 1: <module> (cell.py:9)"
    )
    assert "STALLED ranks 1, 3 for" in status_line(job)
    assert "STALLED ranks 1, 3" in message_html(job) and "%distributed_stacks" in message_html(job)
    view = job.to_json()
    assert view["stall"]["ranks"] == [1, 3] and view["stall"]["where"]
    assert view["stall_after"] == 60.0 and view["on_stall"] == "warn"
    families = {f.name: f for f in build_metrics([job], None, now=100.0)}
    assert [s.value for s in families["mlcluster_stalled_jobs"].samples] == [1]
    (ranks,) = families["mlcluster_job_stalled_ranks"].samples
    (seconds,) = families["mlcluster_job_stalled_seconds"].samples
    assert ranks.value == 2 and seconds.value == 60.0 and ranks.labels["job"] == "jstall00001"
    shared = {f.name: f for f in build_metrics([job], None, now=100.0, shared=True)}
    assert not shared["mlcluster_job_stalled_seconds"].samples  # no job names for everyone
    ended = _stalled_job("failed")
    assert ended.to_json()["stall"] is None and "STALLED" not in status_line(ended)
    families = {f.name: f for f in build_metrics([ended], None, now=100.0)}
    assert [s.value for s in families["mlcluster_stalled_jobs"].samples] == [0]
    assert not families["mlcluster_job_stalled_seconds"].samples


def test_a_stall_judged_without_any_cpu_figure_says_so(tmp_path):
    """Where nothing said how busy a rank was (a pod without its CPU records or the metrics
    API), its stall says it was judged on output and progress alone."""
    from types import SimpleNamespace

    said: list[str] = []
    ctx = SimpleNamespace(
        job=SimpleNamespace(id="j1", stall=None),
        store=SimpleNamespace(job_dir=lambda _id: tmp_path, update_job=lambda *a, **k: None),
        logs=SimpleNamespace(system=said.append),
    )
    clock = [0.0]
    stall = forensics.JobStall(ctx, StallWatch(10, clock=lambda: clock[0]), True)
    for rank in (0, 1):
        stall.active(rank, 0.0)
    stall.cpu(0, 0.2, 1.0)  # rank 0 said its CPU (idle); rank 1 never did
    report = forensics.StackReport(job="j1", ranks=[_rank(0, SLEEPING), _rank(1, SLEEPING)])
    outcome = stall.judge([0, 1], lambda ranks, why: report, now=11.0)
    assert outcome is not None and outcome.message.endswith(
        "ranks 0, 1 stalled: no output, progress or CPU for 10s (no CPU figure for rank 1)"
    ), outcome.message
    assert "(no CPU figure for rank 1)" in said[0]
