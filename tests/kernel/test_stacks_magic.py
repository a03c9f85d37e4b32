"""`%distributed_stacks [JOB]` in a real kernel (issue 33): a job started from a cell with
--no-wait, its ranks read while one sleeps and one spins; without JOB the newest running job
of the user; a rank it does not have and an unknown job are usage errors."""

from __future__ import annotations

from helpers import wait_for
from kernel_session import outputs

CELL = """%%distributed --workers 2 --framework none --no-wait
import os, time

def spin():
    while True:
        pass

print("ready", flush=True)
if os.environ["RANK"] == "1":
    time.sleep(600)
spin()
"""


def _text(msgs) -> str:
    return "".join(m.get("text", "") for m in outputs(msgs, "stream"))


def test_distributed_stacks_in_a_kernel(kernel, service):
    msgs, reply = kernel.execute(CELL)
    assert reply["status"] == "ok", reply
    (job,) = service.store.list_jobs()[0]

    def read() -> str | None:
        lines, _ = service.logs(job.id)
        if len({line["rank"] for line in lines if line["line"] == "ready"}) < 2:
            return None
        msgs, reply = kernel.execute(f"%distributed_stacks {job.id}")
        assert reply["status"] == "ok", reply
        text = _text(msgs)
        return text if "spin (cell.py:" in text and "time.sleep(600)" in text else None

    text = wait_for(read, timeout=180, message="both ranks placed")
    assert f"stacks of job {job.id}, live" in text and "by py-spy" in text
    assert "rank 1: <module> (cell.py:10): time.sleep(600)" in text  # the notebook cell's line

    msgs, reply = kernel.execute("%distributed_stacks --rank 0 --json")  # newest running job
    assert reply["status"] == "ok", reply
    assert '"rank": 0' in _text(msgs) and '"rank": 1' not in _text(msgs)

    msgs, reply = kernel.execute(f"%distributed_stacks {job.id} --rank 5")
    assert reply["status"] == "error" and "has no rank 5" in reply["evalue"]
    msgs, reply = kernel.execute("%distributed_stacks jnosuchjob0")
    assert reply["status"] == "error" and "no job 'jnosuchjob0'" in reply["evalue"]
    service.cancel(job.id)
