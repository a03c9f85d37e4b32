"""Where a job's ranks are (issue 33), on the local backend with real ranks: stacks on
demand (`mlcluster stacks`, JobService.stacks) of ranks hung in a gloo collective, spinning
with the GIL, blocked in I/O and on a lock; the rank's own helper where ptrace is refused;
stalls (flagged, cleared, and --on-stall cancel); and the stacks of the ranks still alive
kept when a job is cancelled, times out or fails while its peers wait."""

from __future__ import annotations

import json
import os
import textwrap

import pytest
from helpers import run_cli, wait_for
from workloads import HANG

from jupyterlab_mlcluster.config import MLClusterConfig
from jupyterlab_mlcluster.jobs import forensics
from jupyterlab_mlcluster.jobs.model import JobSpec, JobState
from jupyterlab_mlcluster.jobs.service import JobService
from jupyterlab_mlcluster.presentation import format_jobs_table
from jupyterlab_mlcluster.runtime.payload import Payload

START = 180  # a cold rank imports torch on a busy 2-core machine


def _submit(service, code: str, **options) -> str:
    record = service.submit(JobSpec.from_options(options), Payload(kind="code", source=code))
    return record.id


def _ready(service, job_id: str, ranks: int, word: str = "ready") -> None:
    """Every rank has printed `word` (then it is where the code leaves it)."""

    def all_said() -> bool:
        record = service.get(job_id)
        assert not record.final, (record.state, record.error, record.reason)
        lines, _ = service.logs(job_id)
        return len({line["rank"] for line in lines if line["line"] == word}) == ranks

    wait_for(all_said, timeout=START, message=f"{ranks} ranks to print {word!r}")


def _final(service, job_id: str, timeout: float = 120):
    return wait_for(
        lambda: (r := service.get(job_id)).final and r, timeout=timeout, message="the job's end"
    )


def test_stacks_of_a_hang_in_a_collective_fold_by_rank(service, pool_mode):
    """Ranks 0 and 2 wait in all_reduce for rank 1, which sleeps: the folded answer names
    them; `--json` has every thread of every rank; a cancel keeps where they were."""
    job = _submit(service, HANG, workers=3)
    _ready(service, job, 3)

    def folded() -> str | None:
        out = run_cli("stacks", job)
        assert out.returncode == 0, out.stderr
        return out.stdout if "all_reduce" in out.stdout and "time.sleep" in out.stdout else None

    text = wait_for(folded, timeout=60, message="ranks 0 and 2 inside all_reduce")
    assert "by py-spy" in text
    assert "ranks 0, 2: all_reduce ← train_step (cell.py:8): dist.all_reduce(t)" in text
    assert "rank 1: <module> (cell.py:12): time.sleep(600)" in text

    whole = run_cli("stacks", job, "--json")
    assert whole.returncode == 0, whole.stderr
    data = json.loads(whole.stdout)
    assert data["complete"] and data["live"] and data["readers"] == ["py-spy"]
    assert [r["rank"] for r in data["ranks"]] == [0, 1, 2]
    for rank in data["ranks"]:
        main = [t for t in rank["threads"] if t["main"]]
        assert len(main) == 1 and main[0]["frames"], rank
    assert [f["ranks"] for f in data["folds"] if f["main"]] == [[0, 2], [1]]

    one = json.loads(run_cli("stacks", job, "--rank", "1", "--json").stdout)
    assert [r["rank"] for r in one["ranks"]] == [1]

    record = service.cancel(job)
    assert record.state == JobState.CANCELLED
    assert "ranks 0, 2 were in all_reduce ← train_step (cell.py:8)" in record.reason
    assert "rank 1 was in <module> (cell.py:12): time.sleep(600)" in record.reason
    kept = run_cli("stacks", job)
    assert kept.returncode == 0, kept.stderr
    assert "kept (cancelled)" in kept.stdout and "ranks 0, 2: all_reduce" in kept.stdout


SPIN_AND_BLOCK = textwrap.dedent(
    """\
    import os, threading

    def spin():
        n = 0
        while True:
            n += 1

    def wait_for_input(path):
        with open(path) as f:
            return f.read()

    def hold(lock):
        lock.acquire()

    rank = int(os.environ["RANK"])
    if rank == 1:
        lock = threading.Lock()
        lock.acquire()
        threading.Thread(target=hold, args=(lock,), name="holder", daemon=True).start()
        print("ready", flush=True)
        wait_for_input(FIFO)
    print("ready", flush=True)
    spin()
    """
)


def test_a_gil_holding_loop_io_and_a_lock_by_py_spy_and_by_the_ranks_helper(service, tmp_path):
    """Rank 0 spins holding the GIL; rank 1 is blocked reading a FIFO, a thread of it on a
    lock. py-spy reads both; so does the rank's own helper (faulthandler), asked directly
    and where ptrace is really refused (py-spy run as another user), saying so."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    code = SPIN_AND_BLOCK.replace("FIFO", repr(str(fifo)))
    job = _submit(service, code, workers=2, framework="none")
    _ready(service, job, 2)

    def both_placed(svc):
        def look():
            report = svc.stacks(job)
            lines = forensics.fold_lines(report)
            return report if any("wait_for_input" in line for line in lines) else None

        return wait_for(look, timeout=30, message="rank 1 in wait_for_input")

    report = both_placed(service)
    assert report.complete and report.readers == ["py-spy"]
    lines = forensics.fold_lines(report)
    # (the loop is sampled on its `while` or its body)
    assert any(line.startswith("rank 0: spin (cell.py:") for line in lines), lines
    assert "rank 1: wait_for_input (cell.py:9): with open(path) as f:" in lines
    assert "rank 1 (thread holder): hold (cell.py:13): lock.acquire()" in lines
    spinning = [t for t in report.ranks[0].threads if t.main][0]
    assert spinning.gil is True and spinning.active is True

    helper = JobService(MLClusterConfig(stacks_reader="helper"))
    report = both_placed(helper)
    assert report.complete
    assert report.readers == ["faulthandler (the rank's own helper)"]
    lines = forensics.fold_lines(report)
    assert any(line.startswith("rank 0: spin (cell.py:") for line in lines), lines
    assert "rank 1: wait_for_input (cell.py:9): with open(path) as f:" in lines

    # ptrace refused for real: the kernel answers EPERM to py-spy run as nobody.
    wrapper = tmp_path / "py-spy-as-nobody"
    py_spy = forensics.readers.py_spy()
    wrapper.write_text(
        f'#!/bin/sh\nexec setpriv --reuid=65534 --regid=65534 --clear-groups {py_spy} "$@"\n'
    )
    wrapper.chmod(0o755)
    refused = JobService(MLClusterConfig(py_spy=str(wrapper)))
    report = both_placed(refused)
    assert report.complete
    (reader,) = report.readers
    assert reader.startswith("faulthandler (the rank's own helper); py-spy: ")
    only_py_spy = JobService(MLClusterConfig(py_spy=str(wrapper), stacks_reader="py-spy"))
    report = only_py_spy.stacks(job)
    assert not report.complete and not report.ranks and set(report.missing) == {0, 1}
    assert "INCOMPLETE" in forensics.format_report(report)

    with open(fifo, "w") as f:  # let rank 1 go on (it spins too), then end the job
        f.write("go")
    service.cancel(job)


def test_stall_is_flagged_then_cleared(service, tmp_path):
    """Both ranks sleep (no output, progress or CPU) past --stall-after: the job says so
    (its record, `mlcluster jobs`, where they are); when they print again, it is cleared."""
    go = tmp_path / "go"
    code = textwrap.dedent(
        f"""\
        import os, time

        def wait_for_go():
            while not os.path.exists({str(go)!r}):
                time.sleep(0.2)

        print("ready", flush=True)
        wait_for_go()
        for i in range(100000):
            print("step", i, flush=True)
            time.sleep(0.05)
        """
    )
    job = _submit(service, code, workers=2, framework="none", stall_after="3s")
    _ready(service, job, 2)
    record = wait_for(
        lambda: (r := service.get(job)).stall and len(r.stall["ranks"]) == 2 and r,
        timeout=60,
        message="the stall flagged",
    )
    view = record.to_json()["stall"]
    assert view["ranks"] == [0, 1] and view["since"]
    assert view["where"] == ["ranks 0, 1: wait_for_go (cell.py:5): time.sleep(0.2)"]
    assert "STALLED ranks 0, 1 for" in format_jobs_table([record])
    kept = service.stacks(job)  # live now; the stall's own are kept with the job
    assert kept.live
    # Kept as each stall was seen: a rank whose last line came later may be flagged a
    # sample after the other (a second report), on a loaded machine.
    assert {k.why for k in forensics.kept(service.store.job_dir(job))} == {"stalled"}

    go.touch()
    wait_for(lambda: service.get(job).stall is None, timeout=60, message="the stall cleared")
    lines, _ = service.logs(job)
    said = [line["line"] for line in lines if line["stream"] == "system"]
    assert any("ranks 0, 1 stalled: no output, progress or CPU for 3s" in s for s in said)
    assert any("no rank is stalled any more" in s for s in said)
    service.cancel(job)


def test_on_stall_cancel_ends_the_job_with_where_its_ranks_were(service):
    job = _submit(service, HANG, workers=2, stall_after="3s", on_stall="cancel")
    record = _final(service, job, timeout=START + 60)
    assert record.state == JobState.CANCELLED
    assert record.reason.startswith("cancelled (--on-stall cancel): ")
    assert "stalled: no output, progress or CPU for 3s" in record.reason
    assert "all_reduce ← train_step (cell.py:8)" in record.reason
    kept = service.stacks(job)
    assert not kept.live and kept.why == "stalled"
    assert any("all_reduce" in line for line in forensics.fold_lines(kept))


def test_timeout_keeps_the_stacks_of_the_ranks_it_stops(service):
    code = textwrap.dedent(
        """\
        import time

        def wait_here():
            time.sleep(600)

        print("ready", flush=True)
        wait_here()
        """
    )
    job = _submit(service, code, workers=2, framework="none", timeout="8s")
    record = _final(service, job, timeout=START)
    assert record.state == JobState.FAILED
    assert record.error == (
        "timed out after 8s; ranks 0, 1 were in wait_here (cell.py:4): time.sleep(600)"
    )
    kept = service.stacks(job)
    assert kept.why == "timeout" and not kept.live and kept.complete


def test_a_failure_names_where_the_waiting_peers_were(service):
    """Rank 1 raises while ranks 0 and 2 wait for it in all_reduce: they are read before
    rank 1's exit closes its sockets (which would fail them too)."""
    code = textwrap.dedent(
        """\
        import torch
        import torch.distributed as dist

        dist.init_process_group("gloo")

        def train_step(t):
            dist.all_reduce(t)

        dist.barrier()
        if dist.get_rank() == 1:
            raise ValueError("boom")
        train_step(torch.ones(2))
        """
    )
    job = _submit(service, code, workers=3)
    record = _final(service, job, timeout=START)
    assert record.state == JobState.FAILED and record.failed_rank == 1
    assert record.error == (
        "rank 1 failed: ValueError: boom; ranks 0, 2 were still in all_reduce ← train_step"
        " (cell.py:7): dist.all_reduce(t)"
    )
    kept = service.stacks(job)
    assert kept.why == "failed" and [r.rank for r in kept.ranks] == [0, 2]


def test_bad_requests_are_refused_and_change_nothing(service, tmp_path, monkeypatch):
    code = 'print("ready", flush=True)\nimport time\ntime.sleep(600)\n'
    job = _submit(service, code, workers=2, framework="none")
    _ready(service, job, 2)
    before = service.get(job).to_json()

    out = run_cli("stacks", job, "--rank", "2")
    assert out.returncode == 2
    assert f"job {job} has no rank 2: its ranks are 0 to 1" in out.stderr
    out = run_cli("stacks", "jdoesnotexist")
    assert out.returncode == 2 and "no job 'jdoesnotexist'" in out.stderr
    out = run_cli("stacks", job, env={**os.environ, "MLCLUSTER_USER": "mallory"})
    assert out.returncode == 2 and f"no job '{job}'" in out.stderr

    # --native where the py-spy at hand cannot read native frames
    fake = tmp_path / "py-spy"
    fake.write_text("#!/bin/sh\necho 'Usage: py-spy dump --pid <pid>'\n")
    fake.chmod(0o755)
    plain = JobService(MLClusterConfig(py_spy=str(fake)))
    with pytest.raises(forensics.StacksUnavailable, match=forensics.NATIVE_UNAVAILABLE):
        plain.stacks(job, native=True)

    after = service.get(job).to_json()
    assert after["state"] == before["state"] == "running"
    assert [r["pid"] for r in after["ranks"]] == [r["pid"] for r in before["ranks"]]
    assert not forensics.kept(service.store.job_dir(job))

    native = service.stacks(job, native=True)  # this machine's py-spy reads them
    assert native.readers == ["py-spy --native"] and native.complete
    frames = [f for r in native.ranks for t in r.threads for f in t.frames]
    assert any(f.native for f in frames) and any(not f.native for f in frames)

    service.cancel(job)
    quick = _submit(service, "print('done')", framework="none")
    assert _final(service, quick).state == JobState.SUCCEEDED
    with pytest.raises(forensics.NoStacks, match="succeeded: it kept no stacks"):
        service.stacks(quick)


def test_stall_options_where_nothing_watches_are_refused(service):
    """A session's cells (its ranks idle between cells) refuse --stall-after/--on-stall:
    never silently ignored, nothing stored. (Every backend watches its jobs' ranks now.)"""
    from jupyterlab_mlcluster.jobs.model import SpecError
    from jupyterlab_mlcluster.jobs.sessions import submit_cell

    with pytest.raises(SpecError, match="do not apply to a session's cells"):
        submit_cell(
            service, "s1", {"stall_after": "1m"}, Payload(source="1"), origin={"kind": "python"}
        )
    assert service.store.list_jobs()[0] == []
