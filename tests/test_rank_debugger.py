"""breakpoint() in a rank (issue 33 item 4), on the local backend with real ranks, warm and
cold: outside a session it fails the rank at once with an error that says a debugger needs a
session, and the job ends (its peer waiting in a sleep is stopped) instead of hanging."""

from __future__ import annotations

import pytest
from helpers import wait_for

from jupyterlab_mlcluster.jobs.model import JobSpec, JobState
from jupyterlab_mlcluster.runtime import debugger
from jupyterlab_mlcluster.runtime.payload import Payload

BREAKS = """\
import os, time
x = 41 + int(os.environ["RANK"])
if os.environ["RANK"] == "1":
    breakpoint()
time.sleep(600)
"""


def test_breakpoint_outside_a_session_says_it_needs_one(service, pool_mode):
    spec = JobSpec.from_options({"workers": 2})
    job = service.submit(spec, Payload(kind="code", source=BREAKS)).id
    record = wait_for(
        lambda: (r := service.get(job)).final and r, timeout=180, message="the job's end"
    )
    assert record.state == JobState.FAILED, (record.state, record.error)
    text = f"{record.error} {record.reason}"
    lines, _ = service.logs(job)
    text += "\n".join(line["line"] for line in lines)
    assert "breakpoint() on rank 1" in text, text
    assert "needs a session" in text and "%%distributed --session NAME" in text, text
    assert "(Pdb)" not in text  # no prompt nobody can answer


def test_a_chosen_pythonbreakpoint_is_honoured(monkeypatch):
    """PYTHONBREAKPOINT=0 turns breakpoint() off, as in Python; unset, the rank refuses."""
    monkeypatch.setenv("PYTHONBREAKPOINT", "0")
    assert debugger.refuse_outside_session() is None
    monkeypatch.delenv("PYTHONBREAKPOINT")
    with pytest.raises(debugger.NeedsSessionError, match="needs a session"):
        debugger.refuse_outside_session()
