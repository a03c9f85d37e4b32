"""`%distributed_debug` in a real kernel (issue 33 item 4): pdb's prompt is the kernel's
input request (answered here on the stdin channel, as a notebook does); a session cell fails
on rank 1, `p y` shows its local, `q` leaves, the session goes on; bad use is a usage error."""

from __future__ import annotations

import threading

from kernel_session import outputs

FAILS = """%%distributed --session dbg --workers 2 --framework none
import os
def step():
    y = 41 + int(os.environ["RANK"])
    if y == 42:
        raise ValueError(f"boom {y}")
step()
"""


def _run_answering(kernel, code: str, answers: list[str]):
    """Run `code`, answering each input request with the next of `answers`."""
    prompts: list[str] = []
    msg_id = kernel.kc.execute(code, allow_stdin=True)
    done = threading.Event()

    def answer() -> None:
        while not done.is_set():
            try:
                msg = kernel.kc.get_stdin_msg(timeout=0.2)
            except Exception:  # noqa: BLE001 - queue.Empty: nothing asked yet
                continue
            if msg["msg_type"] == "input_request":
                prompts.append(msg["content"]["prompt"])
                kernel.kc.input(answers.pop(0) if answers else "q")

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    try:
        msgs, reply = kernel.collect(msg_id, timeout=240)
    finally:
        done.set()
        thread.join(5)
    return "".join(m.get("text", "") for m in outputs(msgs, "stream")), reply, prompts


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

    text, reply, prompts = _run_answering(kernel, "%distributed_debug --rank 1", ["p y", "q"])
    assert reply["status"] == "ok", (reply, text)
    assert prompts == ["(Pdb) ", "(Pdb) "], prompts
    assert "pdb on rank 1" in text and "\n42\n" in text and "session" in text, text

    _, reply = kernel.execute(
        "%%distributed --session dbg --workers 2 --framework none\nprint('kept', z)\n"
    )
    assert reply["status"] == "ok", reply
    kernel.execute("%distributed_session stop dbg")
