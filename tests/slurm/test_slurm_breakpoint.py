"""breakpoint() in a Slurm session's cell (issue 33 item 4), on the real one-node Slurm: the
rank pauses in a live pdb whose link lies in the shared store, the prompt opens from here
(what the notebook's cell and `mlcluster session debug` run), `c` resumes, the cell ends well
and the session goes on."""

from __future__ import annotations

from helpers import session_cell, wait_for

from jupyterlab_mlcluster.jobs import session_debug, sessions

from .test_slurm_sessions import ORIGIN, home, service  # noqa: F401 - the module's fixtures

PAUSES = """\
import os
x = 41 + int(os.environ["RANK"])
if x == 42:
    breakpoint()
print("after", x)
"""


def test_breakpoint_in_a_slurm_session_cell(service, slurm):  # noqa: F811
    def cell(source: str):
        return session_cell(service, "sbp", source, ORIGIN)

    said, answers = [], ["p x", "c"]
    try:
        record = cell(PAUSES)
        job_dir = str(service.store.job_dir(record.id))
        wait_for(
            lambda: session_debug.paused_ranks(job_dir, set(), said.append),
            timeout=120,
            message="rank 1's pause",
        )
        attended, _ = session_debug.attend(
            service, record.id, lambda _: answers.pop(0), said.append
        )
        text = "".join(said)
        assert attended == 1 and "rank 1 paused at cell.py:4" in text, text
        assert "\n42\n" in text and not answers, text
        assert service.wait(record.id, timeout=120).state == "succeeded"
        assert service.wait(cell("print('kept', x)\n").id, timeout=120).state == "succeeded"
    finally:
        sessions.stop_session(service, None, "sbp")
