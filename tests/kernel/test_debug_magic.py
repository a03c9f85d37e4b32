"""pdb on a session's rank in a real kernel (issue 33 item 4): its prompt is the kernel's
input request (answered here on the stdin channel, as a notebook does). `%distributed_debug`:
a session cell fails on rank 1, `p y` shows its local, `q` leaves, the session goes on; bad
use is a usage error. `breakpoint()` in a session cell: the waiting cell opens pdb's prompt
on the paused rank, named, one rank at a time; `c` resumes; an interrupt there ends the cell;
a kernel without stdin says so and the rank goes on; the session is kept throughout."""

from __future__ import annotations

FAILS = """%%distributed --session dbg --workers 2 --framework none
import os
def step():
    y = 41 + int(os.environ["RANK"])
    if y == 42:
        raise ValueError(f"boom {y}")
step()
"""


PAUSES = """%%distributed --session bp --workers 2 --framework none --push BOTH
import os
x = 41 + int(os.environ["RANK"])
if x == 42 or BOTH:
    breakpoint()
print("after", x)
"""


def test_distributed_debug_in_a_kernel(kernel, service):
    _, reply = kernel.execute("%distributed_debug --rank 0")
    assert reply["status"] == "error" and "no live session" in reply["evalue"], reply
    _, reply = kernel.execute("%%distributed --session dbg --workers 2 --framework none\nz = 5\n")
    assert reply["status"] == "ok", reply
    _, reply = kernel.execute("%distributed_debug")
    assert reply["status"] == "error" and "no failed cell" in reply["evalue"], reply
    _, reply = kernel.execute(FAILS, timeout=240)
    assert reply["status"] == "error", reply
    _, reply = kernel.execute("%distributed_debug --rank 7")
    assert reply["status"] == "error" and "ranks 0 to 1" in reply["evalue"], reply

    text, reply, prompts = kernel.execute_answering("%distributed_debug --rank 1", ["p y", "q"])
    assert reply["status"] == "ok", (reply, text)
    assert prompts == ["(Pdb) ", "(Pdb) "], prompts
    assert "pdb on rank 1" in text and "\n42\n" in text and "session" in text, text

    _, reply = kernel.execute(
        "%%distributed --session dbg --workers 2 --framework none\nprint('kept', z)\n"
    )
    assert reply["status"] == "ok", reply
    kernel.execute("%distributed_session stop dbg")


def test_breakpoint_in_a_session_cell(kernel, service):
    _, reply = kernel.execute("BOTH = False")
    assert reply["status"] == "ok", reply
    text, reply, prompts = kernel.execute_answering(PAUSES, ["p x", "c"])
    assert reply["status"] == "ok", (reply, text)
    assert prompts == ["(Pdb rank 1) "] * 2, (prompts, text)
    assert "rank 1 paused at cell.py:5" in text and "\n42\n" in text, text
    assert "rank 1 goes on" in text, text

    # Interrupted at the prompt: pdb is left, the cell ends as interrupted, the session stays.
    text, reply, prompts = kernel.execute_answering(PAUSES, [None])
    assert reply["status"] == "error" and reply["ename"] == "KeyboardInterrupt", (reply, text)
    assert prompts == ["(Pdb rank 1) "], prompts

    # Both ranks pause: one prompt at a time, each named.
    _, reply = kernel.execute("BOTH = True")
    text, reply, prompts = kernel.execute_answering(PAUSES, ["c", "c"])
    assert reply["status"] == "ok", (reply, text)
    assert sorted(prompts) == ["(Pdb rank 0) ", "(Pdb rank 1) "], (prompts, text)
    first, second = (prompt.split()[2].rstrip(")") for prompt in prompts)
    assert (
        text.index(f"rank {first} paused")
        < text.index(f"rank {first} goes on")
        < text.index(f"rank {second} paused")
        < text.index(f"rank {second} goes on")
    ), text

    # A kernel run without stdin cannot ask: it says so, and the rank goes on.
    _, reply = kernel.execute("BOTH = False")
    text, reply, prompts = kernel.execute_answering(PAUSES, [], allow_stdin=False)
    assert reply["status"] == "ok" and not prompts, (reply, text)
    assert "rank 1: pdb's prompt cannot open here" in text and "the rank goes on" in text, text

    _, reply = kernel.execute(
        "%%distributed --session bp --workers 2 --framework none\nprint('kept', x)\n"
    )
    assert reply["status"] == "ok", reply
    kernel.execute("%distributed_session stop bp")
