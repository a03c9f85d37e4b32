"""Slurm asked once (watch.py), and Slurm ranks' own figures (issue 34, items 2 and 3).

The squeue the backend meets is a wrapper that logs each call, then runs the real one: the
calls are counted with a dozen jobs following their allocations, most of them waiting.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import time

import pytest
from helpers import wait_for

from jupyterlab_mlcluster.backends.slurm import watch
from jupyterlab_mlcluster.backends.slurm.backend import current_slurm_user
from jupyterlab_mlcluster.jobs.model import JobSpec, JobState
from jupyterlab_mlcluster.runtime.payload import Payload

COMMANDS = ("sbatch", "squeue", "scancel", "scontrol", "sinfo", "sacct")
JOBS = 12


@pytest.fixture
def counted(slurm_store, tmp_path):
    """slurm_bin_dir whose squeue logs each call (its time) before running the real one; a
    watcher asking once a second."""
    bin_dir, calls = tmp_path / "slurm-bin", tmp_path / "squeue-calls"
    bin_dir.mkdir()
    for command in COMMANDS:
        real = shutil.which(command)
        assert real, f"{command} not on PATH"
        if command != "squeue":
            (bin_dir / command).symlink_to(real)
            continue
        wrapper = bin_dir / "squeue"
        # While `<calls>.refuse` exists, squeue refuses as a controller that lost our user
        # would (not a transient error: no retry).
        wrapper.write_text(
            f"#!/bin/sh\ndate +%s.%N >> {calls}\n"
            f"if [ -e {calls}.refuse ]; then\n"
            "  echo 'squeue: error: Access/permission denied' >&2\n  exit 1\nfi\n"
            f'exec {real} "$@"\n'
        )
        wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    config = slurm_store.parent / "jupyter-config" / "jupyter_mlcluster_config.json"
    settings = json.loads(config.read_text())
    settings["MLClusterConfig"].update(slurm_bin_dir=str(bin_dir), slurm_poll_interval=1.0)
    config.write_text(json.dumps(settings))
    return calls


def calls_between(calls, start: float, end: float) -> list[float]:
    times = [float(t) for t in calls.read_text().split()] if calls.exists() else []
    return [t for t in times if start <= t <= end]


@pytest.fixture
def service(slurm_store):
    from jupyterlab_mlcluster.jobs.service import JobService

    svc = JobService()
    yield svc
    for record in svc.store.list_jobs()[0]:
        if not record.final:
            svc.cancel(record.id, wait=False)
    wait_for(
        lambda: svc.reap(force=True) is not None and all(r.final for r in svc.list()[0]),
        120,
        message="every job to end",
    )


def positions(service, ids) -> dict[str, int]:
    found = {}
    for job_id in ids:
        reason = service.get(job_id).reason or ""
        if "position " in reason:
            found[job_id] = int(reason.split("position ")[1].split()[0])
    return found


def test_a_dozen_jobs_ask_squeue_once_a_second_and_a_dead_watcher_is_replaced(
    counted, service, slurm, slurm_store
):
    spec = JobSpec.from_options({"backend": "slurm", "workers": 1})
    jobs = [
        service.submit(spec, Payload(source="import time\ntime.sleep(600)\n")) for _ in range(JOBS)
    ]
    ids = [j.id for j in jobs]
    # The node has 2 CPUs: 2 run, the others wait, each told its place in Slurm's queue.
    wait_for(
        lambda: sorted(positions(service, ids).values()) == list(range(1, JOBS - 1)),
        180,
        interval=0.5,
        message="every waiting job's place in the queue (1 to 10, each once)",
    )

    # Slurm names a pending job's reason once its scheduler has looked at it ("None" until
    # then, which the job's reason says as it is): wait for that look, then every waiting job
    # says why it waits.
    def reasons() -> list[str]:
        return [service.get(i).reason or "" for i in positions(service, ids)]

    wait_for(
        lambda: all("Resources" in r or "Priority" in r for r in reasons()),
        180,
        interval=0.5,
        message="every waiting job's reason from Slurm's scheduler",
    )

    start = time.time()
    time.sleep(6.0)  # (a window to count in; nothing is awaited)
    counted_calls = calls_between(counted, start, time.time())
    assert len(counted_calls) <= 7, f"{len(counted_calls)} squeue calls in 6 s for {JOBS} jobs"
    assert len(counted_calls) >= 3, "the watcher should still ask"

    # A state change (the first waiting job cancelled in Slurm) is seen within 2 s.
    first = min(positions(service, ids).items(), key=lambda item: item[1])[0]
    slurm_id = service.get(first).backend_state["slurm_job_id"]
    cancelled_at = time.time()
    slurm.run("scancel", slurm_id)
    wait_for(lambda: service.get(first).final, 30, interval=0.02, message="the cancel to be seen")
    seen_after = time.time() - cancelled_at
    assert service.get(first).state == JobState.CANCELLED
    assert seen_after <= 2.5, f"seen {seen_after:.2f} s after scancel"

    # The watcher (one of the supervisors) killed: another supervisor takes over.
    path = watch.snapshot_path(slurm_store, current_slurm_user())
    snapshot = watch.read_snapshot(path)
    dead = snapshot["watcher"]
    assert dead in [service.get(i).supervisor["pid"] for i in ids]
    os.kill(dead, signal.SIGKILL)
    killed_at = time.time()
    wait_for(
        lambda: (
            (watch.read_snapshot(path) or {}).get("watcher") not in (None, dead)
            and watch.read_snapshot(path)["asked_at"] > killed_at
        ),
        30,
        message="another watcher",
    )
    print(
        f"squeue calls in 6 s: {len(counted_calls)}; cancel seen after {seen_after:.2f} s; "
        f"new watcher after {time.time() - killed_at:.2f} s"
    )


def test_slurm_ranks_report_their_cpu_and_memory(service):
    burn = "import time\nend = time.time() + 6\nwhile time.time() < end:\n    pass\n"
    spec = JobSpec.from_options({"backend": "slurm", "workers": 2})
    job = service.submit(spec, Payload(source=burn))
    record = service.wait(job.id, timeout=120)
    assert record.state == JobState.SUCCEEDED, record.error
    history = service.store.metrics_history(job.id)
    assert sorted(history) == [0, 1], history
    for rank, series in history.items():
        # (busy, though on a loaded 2-core machine the two ranks' share is far from 100%)
        assert max(s["cpu_percent"] or 0 for s in series) > 5, (rank, series)
        assert min(s["memory_bytes"] or 0 for s in series) > 10 << 20, (rank, series)
    assert all(r.metrics.get("cpu_percent") is not None for r in record.ranks)


def test_a_watcher_that_cannot_ask_slurm_fails_the_job_saying_so(counted, service, slurm_store):
    """squeue refusing five asks in a row (the watcher backing off between them) loses the
    job: stopped as a cancel is, failed in Slurm's words; its allocation still goes once
    Slurm answers again."""
    job = service.submit(
        JobSpec.from_options({"backend": "slurm", "workers": 1}),
        Payload(source="import time\nprint('up', flush=True)\ntime.sleep(600)\n"),
    )
    wait_for(lambda: [line["line"] for line in service.logs(job.id)[0]] == ["up"], 60, message="up")
    refuse = counted.with_name(counted.name + ".refuse")
    refuse.write_text("")
    try:
        wait_for(
            lambda: any(
                "stopping (lost contact with Slurm" in line["line"]
                for line in service.logs(job.id)[0]
            ),
            120,
            interval=0.2,
            message="the job to stop, having lost Slurm",
        )
    finally:
        refuse.unlink()
    record = service.wait(job.id, timeout=120)
    assert record.state == JobState.FAILED
    assert record.error.startswith("lost contact with Slurm: squeue: error: Access/permission")


# -- the snapshot's reading, without Slurm ------------------------------------------------


def test_a_job_view_from_a_snapshot():
    snapshot = {
        "asked_at": 100.0,
        "jobs": {
            "7": {"id": "7", "state": "PENDING", "reason": "(Priority)"},
            "9": {"id": "9", "state": "RUNNING", "nodes": "n1"},
        },
        "accounted": {"5": {"id": "5", "state": "TIMEOUT"}},
        "pending": [["3", "gpu"], ["4", "debug,gpu"], ["6", "debug"], ["7", "gpu"]],
    }
    assert watch.job_view(snapshot, "7", "gpu", since=99.0) == (snapshot["jobs"]["7"], 3)
    assert watch.job_view(snapshot, "7", "", since=99.0)[1] == 4  # every partition's queue
    assert watch.job_view(snapshot, "9", "gpu", since=99.0) == (snapshot["jobs"]["9"], None)
    assert watch.job_view(snapshot, "5", "gpu", since=99.0)[0]["state"] == "TIMEOUT"
    assert watch.job_view(snapshot, "8", "gpu", since=99.0) == ({}, None)  # forgotten
    # An answer asked before the job was submitted says nothing about it.
    assert watch.job_view(snapshot, "8", "gpu", since=101.0) == (None, None)
    assert watch.job_view(None, "7", "gpu", since=0.0) == (None, None)


def test_sacct_rows_in_squeues_shape():
    from jupyterlab_mlcluster.backends.slurm import script

    text = "41|CANCELLED by 0|n[1-2]|gpu|alice\n42|COMPLETED|n1|gpu|alice\n42.0|COMPLETED|n1||\n"
    rows = script.parse_accounting(text)
    assert [(r["id"], r["state"], r["nodes"]) for r in rows] == [
        ("41", "CANCELLED", "n[1-2]"),
        ("42", "COMPLETED", "n1"),
    ]
    watched = script.parse_jobs("7|PENDING|(Priority)|(null)|gpu|alice|a|b\n", script.WATCH_FIELDS)
    assert watched[0]["comment"] == "a|b" and watched[0]["user"] == "alice"


def test_a_slurm_jobs_idle_gpus_are_flagged(slurm_store):
    """The idle-GPU flag from what the ranks report. This machine has no GPU, so the ranks
    report a GPU figure of 0% themselves, over the same signed report channel their metrics
    thread uses (a rank on a GPU node reports NVML's)."""
    config = slurm_store.parent / "jupyter-config" / "jupyter_mlcluster_config.json"
    settings = json.loads(config.read_text())
    settings["MLClusterConfig"].update(idle_gpu_after=1.0)
    config.write_text(json.dumps(settings))
    from jupyterlab_mlcluster.jobs.service import JobService

    service = JobService()  # (a job's settings are its submitter's, read when it starts)
    idle = (
        "import time\n"
        "from jupyterlab_mlcluster.runtime import reporting\n"
        "for _ in range(40):\n"
        "    reporting.send({'type': 'metrics', 'cpu_percent': 1.0, 'memory_bytes': 1,\n"
        "                    'gpu_util': 0.0, 'gpu_memory_bytes': 1 << 30})\n"
        "    time.sleep(0.25)\n"
    )
    job = service.submit(
        JobSpec.from_options({"backend": "slurm", "workers": 2}), Payload(source=idle)
    )
    wait_for(
        lambda: service.get(job.id).gpu_idle_since is not None,
        60,
        interval=0.2,
        message="the job flagged as holding idle GPUs",
    )
    record = service.wait(job.id, timeout=120)
    assert record.state == JobState.SUCCEEDED, record.error
