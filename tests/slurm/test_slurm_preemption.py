"""A real Slurm preemption costs no work (issue 33, item 5): the README's example
(examples/dcp_resume.py, as it is) runs in the `debug` partition; a job in `urgent`
preempts it (PreemptMode=CANCEL, tests/slurm/cluster.py): Slurm sends its tasks SIGTERM,
they save a torch.distributed.checkpoint at the step they are at, and `--max-restarts`
starts the gang again in a new allocation, which resumes at that very step once the
urgent job is done. The attempt's reason in the record is Slurm's: preempted.
"""

from __future__ import annotations

import re

import pytest
from helpers import REPO, WAIT_SCALE, wait_for

from jupyterlab_mlcluster.jobs.model import JobSpec, JobState
from jupyterlab_mlcluster.runtime.payload import Payload

EXAMPLE = REPO / "examples" / "dcp_resume.py"


@pytest.fixture
def service(slurm_store):
    from jupyterlab_mlcluster.jobs.service import JobService

    svc = JobService()
    yield svc
    for record in svc.store.list_jobs()[0]:
        if not record.final:
            svc.cancel(record.id)


def lines_of(service, job_id: str, rank: int) -> list[str]:
    return [entry["line"] for entry in service.logs(job_id, rank=rank)[0]]


def test_a_preempted_job_saves_on_sigterm_and_resumes_at_that_step(service, tmp_path):
    env = {
        "CKPT_DIR": str(tmp_path / "ckpt"),
        "STEPS": "40",
        "CKPT_EVERY": "1000",  # no periodic checkpoint: only SIGTERM's
        "STEP_SECONDS": "0.5",  # 20 s for the urgent job to preempt it
    }
    spec = JobSpec.from_options({"backend": "slurm", "workers": 2, "max_restarts": 1, "env": env})
    job = service.submit(spec, Payload(source=EXAMPLE.read_text()))
    wait_for(
        lambda: "attempt 0: starting at step 0" in lines_of(service, job.id, 0),
        90,
        message="the first attempt trains",
    )
    urgent = service.submit(
        JobSpec.from_options({"backend": "slurm", "workers": 2, "queue": "urgent"}),
        Payload(source="print('urgent ran')"),
    )
    record = service.wait(job.id, timeout=120 * WAIT_SCALE)
    assert record.state == JobState.SUCCEEDED, (record.error, record.attempts)
    assert service.wait(urgent.id, timeout=20 * WAIT_SCALE).state == JobState.SUCCEEDED
    assert record.restarts == 1
    first = record.attempts[0]
    assert (first["outcome"], first["restarted"]) == ("failed", True)
    assert first["reason"] == "Slurm preempted the job (PREEMPTED)", first
    text = lines_of(service, job.id, 0)
    saved = [
        m.group(1) for line in text if (m := re.fullmatch(r"SIGTERM: saved step (\d+).*", line))
    ]
    assert len(saved) == 1 and 0 < int(saved[0]) < 40, text
    # Nothing lost: the new allocation starts at the step SIGTERM saved.
    assert f"attempt 1: starting at step {saved[0]}" in text, text
    assert service.result(job.id)[1]["step"] == 40
