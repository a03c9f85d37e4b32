"""breakpoint() in a rank (issue 33 item 4), on the local backend with real ranks, warm and
cold: outside a session it fails the rank at once with an error that says a debugger needs a
session, and the job ends (its peer waiting in a sleep is stopped) instead of hanging."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import run_cli, session_cell, wait_for

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

PAUSES_ON_RANK_1 = """\
import os
x = 41 + int(os.environ["RANK"])
if x == 42:
    breakpoint()
print("after", x)
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
    session cell pauses its rank, `mlcluster session debug` opens pdb there, and the
    session goes on."""
    from jupyterlab_mlcluster.jobs import session_debug, sessions

    def cell(source: str):
        return service.wait(session_cell(service, "dbg", source).id, timeout=300)

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
        # breakpoint() in a cell nobody waits on in a kernel: the terminal's
        # `mlcluster session debug` opens pdb there, live; `c` resumes, the cell ends well.
        record = session_cell(service, "dbg", PAUSES_ON_RANK_1)
        job_dir = str(service.store.job_dir(record.id))
        wait_for(
            lambda: session_debug.paused_ranks(job_dir, set(), print),
            timeout=120,
            message="rank 1's pause",
        )
        out = run_cli("session", "debug", "dbg", input="p x\nc\n")
        assert out.returncode == 0, out.stderr
        assert "rank 1 paused at cell.py:4" in out.stdout, out.stdout
        assert "(Pdb rank 1) 42\n" in out.stdout and "goes on" in out.stdout, out.stdout
        paused = service.wait(record.id, timeout=120)
        assert paused.state == "succeeded", paused.error
        assert "after 42" in lines(paused)[1], lines(paused)
        assert cell("print('still here', x)\n").state == "succeeded"
    finally:
        sessions.stop_session(service, None, "dbg")


def test_post_mortem_on_a_rank_of_a_session(service):
    """`session_debug.debug` (what %distributed_debug and `mlcluster session debug` run):
    pdb on rank 1's traceback of the last failed cell shows its locals, `q` leaves, and the
    session goes on with its state; bad use is refused before any cell is sent."""
    from jupyterlab_mlcluster.jobs import session_debug, sessions

    origin = {"kind": "python"}

    def cell(source: str):
        record, _ = sessions.submit_cell(
            service, "pm", {"workers": 2}, Payload(kind="code", source=source), origin=origin
        )
        return service.wait(record.id, timeout=300)

    def debug(rank, answers):
        said, asked = [], []

        def ask(prompt: str) -> str:
            asked.append(prompt)
            return answers.pop(0)

        def say(text: str) -> None:
            said.append(text)

        end = session_debug.debug(service, None, "pm", rank, origin=origin, ask=ask, say=say)
        return end, "".join(said), asked

    with pytest.raises(sessions.UnknownSession):
        debug(1, [])
    try:
        assert cell("z = 5\n").state == "succeeded"
        with pytest.raises(sessions.SessionError, match="no failed cell"):
            debug(1, [])
        assert cell(FAILS_ON_RANK_1).state == "failed"
        cells_before = len(service.store.session_cells(_holder(service).id, ["succeeded"]))
        with pytest.raises(sessions.SessionError, match="--rank 2: .* ranks 0 to 1"):
            debug(2, [])
        assert len(service.store.session_cells(_holder(service).id, ["succeeded"])) == (
            cells_before
        )
        end, said, asked = debug(None, ["p y", "where", "q"])  # rank 1 failed first
        assert "pdb on rank 1" in said and "\n42\n" in said, said
        assert "step()" in said and "raise ValueError" in said, said
        assert asked == ["(Pdb) "] * 3 and "session" in end
        with pytest.raises(sessions.SessionError, match="rank 0 did not fail"):
            debug(0, [])
        end, said, _ = debug(1, ["p y + 1", "c"])  # again, and `continue` leaves too
        assert "\n43\n" in said, said
        # From a terminal: the same prompt on stdin and stdout; its end of input leaves.
        out = run_cli("session", "debug", "pm", "--rank", "1", input="p y * 2\n")
        assert out.returncode == 0, out.stderr
        assert "(Pdb) 84\n" in out.stdout and "the session and its state are kept" in out.stdout
        out = run_cli("session", "debug", "pm", "--rank", "9", input="")
        assert out.returncode != 0 and "--rank 9" in out.stderr, out
        assert cell("print('kept', z)\n").state == "succeeded"
    finally:
        sessions.stop_session(service, None, "pm")


def _holder(service):
    return service.store.get_job(service.store.session_rows(name="pm")[0]["job_id"])


def test_the_relay_refuses_files_others_could_write(tmp_path):
    """Whoever writes pdb's input runs code as the rank's user: a relay file that others may
    write, or a link to one, is refused before pdb starts."""
    for part in ("in", "out"):
        (tmp_path / part).write_bytes(b"")
        (tmp_path / part).chmod(0o600)
    debugger.FileRelay(str(tmp_path)).close()  # the private pair is taken
    (tmp_path / "in").chmod(0o666)  # (what an attacker on the machine would need)
    with pytest.raises(PermissionError, match="not a private file"):
        debugger.FileRelay(str(tmp_path))
    (tmp_path / "in").unlink()
    (tmp_path / "elsewhere").write_bytes(b"import os\n")
    (tmp_path / "elsewhere").chmod(0o600)
    (tmp_path / "in").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(OSError):
        debugger.FileRelay(str(tmp_path))


def test_a_paused_ranks_link_must_be_private(tmp_path):
    """Whatever is typed at a paused rank's prompt goes into its link's input, and what its
    output says is shown as pdb's: a link (runtime/live_pause.py) that is not a private
    directory of this user with private files is refused, said, and never attended."""
    from jupyterlab_mlcluster.jobs import session_debug

    def pause(name: str, rank: int) -> Path:
        directory = tmp_path / name
        directory.mkdir(mode=0o700)
        (directory / "out").write_text(json.dumps({"paused": {"rank": rank, "where": "x:1"}}))
        (directory / "in").write_bytes(b"")
        for part in ("in", "out"):
            (directory / part).chmod(0o600)
        return directory

    pause("pause-0-aa", 0)
    (pause("pause-1-bb", 1) / "in").chmod(0o622)  # others may type into it
    (pause("pause-2-cc", 2)).chmod(0o777)  # others may swap its files
    (pause("pause-3-dd", 3) / "out").unlink()
    (tmp_path / "pause-3-dd" / "out").symlink_to(tmp_path / "pause-0-aa" / "out")
    said: list[str] = []
    seen: set[str] = set()
    found = session_debug.paused_ranks(str(tmp_path), seen, said.append)
    assert [(p.rank, p.where) for p in found] == [(0, "x:1")], (found, said)
    assert len(said) == 3 and all("refused a paused rank's pdb link" in s for s in said), said
    assert session_debug.paused_ranks(str(tmp_path), seen, said.append) == []  # said once
    assert len(said) == 3
