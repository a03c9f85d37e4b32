"""breakpoint() in a rank (issue 33 item 4), on the local backend with real ranks, warm and
cold: outside a session it fails the rank at once with an error that says a debugger needs a
session, and the job ends (its peer waiting in a sleep is stopped) instead of hanging."""

from __future__ import annotations

import os

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


FAILS_ON_RANK_1 = """\
import os
def step():
    y = 41 + int(os.environ["RANK"])
    if y == 42:
        raise ValueError(f"boom {y}")
step()
"""

LOOKS_BACK = """\
import sys, os
e = getattr(sys, "last_exc", None)
tb = sys.last_traceback if e is not None else None
frames = []
while tb is not None:
    frames.append(tb.tb_frame.f_code.co_name)
    last = tb
    tb = tb.tb_next
print("last", type(e).__name__, frames, last.tb_frame.f_locals.get("y") if frames else None)
"""


def test_a_session_rank_keeps_its_failed_cells_exception(service):
    """A session cell fails on rank 1: the next cell finds the exception where the
    interactive interpreter keeps one, from the cell's own frames (not the runtime's), the
    failing frame's locals in it; rank 0, which did not fail, has none. breakpoint() in a
    session cell says it has no prompt yet (before: a bare BdbQuit), and the session goes on."""
    from jupyterlab_mlcluster.jobs import sessions

    def cell(source: str):
        record, _ = sessions.submit_cell(
            service,
            "dbg",
            {"workers": 2},
            Payload(kind="code", source=source, cwd=os.getcwd()),
            origin={"kind": "python"},
        )
        return service.wait(record.id, timeout=300)

    def lines(record) -> dict[int, list[str]]:
        by_rank: dict[int, list[str]] = {0: [], 1: []}
        for line in service.logs(record.id)[0]:
            if line["stream"] != "system":
                by_rank[line["rank"]].append(line["line"])
        return by_rank

    try:
        failed = cell(FAILS_ON_RANK_1)
        assert failed.state == "failed" and "boom 42" in (failed.error or ""), failed.error
        looked = lines(cell(LOOKS_BACK))
        assert looked[1] == ["last ValueError ['<module>', 'step'] 42"], looked
        assert looked[0] == ["last NoneType [] None"], looked
        paused = cell("x = 1\nbreakpoint()\n")
        assert paused.state == "failed"
        assert "breakpoint() on rank 0" in (paused.error or "") + "\n".join(lines(paused)[0])
        assert "cannot yet open pdb's prompt" in "\n".join(lines(paused)[0] + lines(paused)[1])
        assert cell("print('still here', x)\n").state == "succeeded"
    finally:
        sessions.stop_session(service, None, "dbg")
