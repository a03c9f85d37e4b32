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
    from jupyterlab_mlcluster.kernel.monitor import status_line, summary_html
    from jupyterlab_mlcluster.presentation import format_jobs_table

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
    if running.state == JobState.RUNNING:
        line = status_line(running)
        assert "restart 1 of 1 (attempt 0: rank 1 was killed by SIGKILL" in line, line
        table = format_jobs_table([running])
        assert "restart 1 of 1 (attempt 0: rank 1 was killed" in table, table

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
