"""Preemption and lost ranks cost no work (issue 33, item 5), on the local backend: the
README's example (examples/dcp_resume.py, run here as it is, so the README cannot drift)
checkpoints with torch.distributed.checkpoint; a rank killed with -9 mid-run fails the
attempt, `--max-restarts` starts the whole gang again with TORCHELASTIC_RESTART_COUNT=1, it
resumes at the step it saved and ends with the weights of an uninterrupted run. The job's
record keeps each attempt and why it ended, and the cell's monitor and `mlcluster jobs` say
it. (Slurm: tests/slurm/test_slurm_preemption.py; Kubernetes: tests/kube/test_k8s_eviction.py.)
"""

from __future__ import annotations

import datetime
import os
import re
import signal
import time

from helpers import REPO, wait_for

from jupyterlab_mlcluster.jobs.model import JobSpec, JobState
from jupyterlab_mlcluster.runtime.payload import Payload

EXAMPLE = REPO / "examples" / "dcp_resume.py"


def example_job(service, ckpt_dir, *, max_restarts: int, step_seconds: float = 0.0):
    env = {
        "CKPT_DIR": str(ckpt_dir),
        "STEPS": "24",
        "CKPT_EVERY": "5",
        "STEP_SECONDS": str(step_seconds),
    }
    spec = JobSpec.from_options({"workers": 2, "max_restarts": max_restarts, "env": env})
    return service.submit(spec, Payload(source=EXAMPLE.read_text())).id


def lines_of(service, job_id: str, rank: int) -> list[str]:
    return [entry["line"] for entry in service.logs(job_id, rank=rank)[0]]


def test_a_rank_killed_with_9_restarts_the_gang_which_resumes_where_it_saved(service, tmp_path):
    from jupyterlab_mlcluster.kernel.job_html import status_line, summary_html

    straight = example_job(service, tmp_path / "straight", max_restarts=0)
    reference = service.wait(straight, timeout=120)
    assert reference.state == JobState.SUCCEEDED, reference.error
    assert reference.attempts == []  # (a job that cannot restart has no history of them)
    kind, expected = service.result(straight)

    job_id = example_job(service, tmp_path / "interrupted", max_restarts=1, step_seconds=0.1)
    wait_for(lambda: "saved step 10" in lines_of(service, job_id, 0), 120, message="a checkpoint")
    victim = service.store.get_job(job_id).ranks[1].pid
    os.kill(victim, signal.SIGKILL)
    killed_at = time.time()
    # While the second attempt runs, the job says it was restarted and why.
    running = wait_for(
        lambda: (r := service.store.get_job(job_id)).restarts == 1 and r.attempts and r,
        60,
        message="the restart",
    )
    (first,) = running.attempts
    assert first["attempt"] == 0 and first["outcome"] == "failed" and first["restarted"]
    assert first["reason"].startswith("rank 1 was killed by SIGKILL"), first
    assert first["failed_rank"] == 1 and first["started"] <= first["ended"]
    assert running.state in (JobState.STARTING, JobState.RUNNING)  # (the monitor: below)
    assert "restart 1 of 1 (attempt 0: rank 1 was killed by SIGKILL" in status_line(running)

    final = service.wait(job_id, timeout=120)
    assert final.state == JobState.SUCCEEDED, final.error
    assert final.restarts == 1
    assert service.result(job_id) == (kind, expected)  # the weights of the straight run
    # The second attempt resumed at the last step the first one saved.
    text = lines_of(service, job_id, 0)
    saved = [int(m.group(1)) for line in text if (m := re.fullmatch(r"saved step (\d+)", line))]
    restart = next(i for i, line in enumerate(text) if "restarting all ranks" in line)
    before = [
        int(m.group(1)) for m in map(re.compile(r"saved step (\d+)").fullmatch, text[:restart]) if m
    ]
    resumed = next(line for line in text if line.startswith("attempt 1: starting at step"))
    assert resumed == f"attempt 1: starting at step {max(before)}", (resumed, before)
    assert saved[-1] == 20 and text[0] == "attempt 0: starting at step 0"
    # Each attempt and why it ended: in the record, over REST, and in the cell's summary.
    assert [(a["attempt"], a["outcome"], a["restarted"]) for a in final.attempts] == [
        (0, "failed", True),
        (1, "succeeded", False),
    ]
    rest = final.to_json()["attempts"]
    assert rest[0]["reason"].startswith("rank 1 was killed by SIGKILL")
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT.*", rest[0]["ended"])
    html = summary_html(final)
    assert "attempt 0 (" in html and "rank 1 was killed by SIGKILL" in html
    assert "; restarted" in html and "attempt 1 (" in html and ": succeeded" in html
    resumed_at = next(
        e["ts"] for e in service.logs(job_id, rank=0)[0] if e["line"].startswith("attempt 1:")
    )
    took = datetime.datetime.fromisoformat(resumed_at).timestamp() - killed_at
    print(f"kill -9 -> resumed at step {max(before)} {took:.1f} s later")


def test_each_attempt_is_said_in_the_monitor_and_mlcluster_jobs_and_the_first_and_last_are_kept():
    from jupyterlab_mlcluster.jobs import lifecycle
    from jupyterlab_mlcluster.jobs.lifecycle import Outcome, OutcomeKind
    from jupyterlab_mlcluster.jobs.record import JobRecord
    from jupyterlab_mlcluster.kernel.job_html import status_line, summary_html
    from jupyterlab_mlcluster.presentation import format_jobs_table

    spec = JobSpec.from_options({"workers": 2, "max_restarts": 3})
    record = JobRecord(id="j0123456789", name="train", spec=spec, state=JobState.RUNNING)
    record.created = record.started = time.time() - 90
    record.restarts = 1
    record.attempts = [
        {
            "attempt": 0,
            "started": record.started,
            "ended": record.started + 42,
            "outcome": "failed",
            "reason": "Slurm preempted the job (PREEMPTED)",
            "failed_rank": None,
            "restarted": True,
        }
    ]
    said = "restart 1 of 3 (attempt 0: Slurm preempted the job (PREEMPTED))"
    assert said in status_line(record)
    assert "restart 1 of 3 (attempt 0: Slurm preempted" in format_jobs_table([record])
    html = summary_html(record)
    assert "attempt 0 (0:42): failed: Slurm preempted the job (PREEMPTED); restarted" in html
    assert "attempt 1: running" in html
    record.state = JobState.SUCCEEDED  # a finished job lists its attempts, says no restart
    assert "restart 1 of 3" not in format_jobs_table([record])
    assert "attempt 1: running" not in summary_html(record)

    class Context:  # what ended_attempt reads and writes of a JobContext
        job = record

    record.attempts = []
    outcome = Outcome(OutcomeKind.FAILED, "lost", restartable=True)
    for n in range(lifecycle.ATTEMPTS_KEPT + 5):
        history = lifecycle.ended_attempt(Context, n, 0.0, outcome, "lost", restarted=True)
    assert len(history) == lifecycle.ATTEMPTS_KEPT
    assert history[0]["attempt"] == 0 and history[-1]["attempt"] == lifecycle.ATTEMPTS_KEPT + 4
    assert history[1]["attempt"] == 6  # the first, then the last 49
