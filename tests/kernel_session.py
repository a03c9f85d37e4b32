"""Driving a real IPython kernel through jupyter_client, and reading what it sent."""

from __future__ import annotations

import queue
import re
import threading
import time
from collections.abc import Callable
from typing import Any


class KernelSession:
    def __init__(self, km, kc):
        self.km = km
        self.kc = kc

    def execute(
        self, code: str, timeout: float = 120, on_msg: Callable[[dict], None] | None = None
    ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """Run code; returns (iopub messages of this execution, execute_reply content)."""
        msg_id = self.kc.execute(code)
        return self.collect(msg_id, timeout, on_msg)

    def collect(self, msg_id: str, timeout: float = 120, on_msg=None):
        msgs = []
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"no idle status within {timeout}s")
            try:
                msg = self.kc.get_iopub_msg(timeout=remaining)
            except queue.Empty:
                continue
            if msg["parent_header"].get("msg_id") != msg_id:
                if msg["msg_type"] in ("comm_msg", "comm_open"):
                    msgs.append(msg)  # widget traffic may carry another parent
                continue
            if on_msg is not None:
                on_msg(msg)
            if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                break
            msgs.append(msg)
        while True:
            reply = self.kc.get_shell_msg(timeout=30)
            if reply["parent_header"].get("msg_id") == msg_id:
                return msgs, reply["content"]

    def execute_answering(
        self,
        code: str,
        answers: list[str | None],
        allow_stdin: bool = True,
        timeout: float = 240,
    ) -> tuple[str, dict[str, Any], list[str]]:
        """Run `code`, answering each input request (pdb's prompt) with the next of `answers`
        ("q" once they run out; None: interrupt the kernel instead). Returns (the stream
        text, the execute_reply content, the prompts asked)."""
        prompts: list[str] = []
        msg_id = self.kc.execute(code, allow_stdin=allow_stdin)
        done = threading.Event()

        def answer() -> None:
            while not done.is_set():
                try:
                    msg = self.kc.get_stdin_msg(timeout=0.2)
                except Exception:  # noqa: BLE001 - queue.Empty: nothing asked yet
                    continue
                if msg["msg_type"] == "input_request":
                    prompts.append(msg["content"]["prompt"])
                    given = answers.pop(0) if answers else "q"
                    if given is None:
                        self.km.interrupt_kernel()
                    else:
                        self.kc.input(given)

        thread = threading.Thread(target=answer, daemon=True)
        thread.start()
        try:
            msgs, reply = self.collect(msg_id, timeout=timeout)
        finally:
            done.set()
            thread.join(5)
        return "".join(m.get("text", "") for m in outputs(msgs, "stream")), reply, prompts


def outputs(msgs, *types: str) -> list[dict[str, Any]]:
    return [m["content"] for m in msgs if m["msg_type"] in types]


def output_texts(msgs) -> list[str]:
    """The final text of every rank's one updating output, in the order they were shown."""
    by_display: dict[str, str] = {}
    for m in msgs:
        if m["msg_type"] in ("display_data", "update_display_data"):
            display_id = m["content"].get("transient", {}).get("display_id", "")
            if display_id.startswith("mlcluster-rank-"):
                by_display[display_id] = m["content"]["data"]["text/plain"]
    return list(by_display.values())


def rank_texts(msgs) -> dict[int, str]:
    """The final text of each rank's one updating output (that shows a line of the rank's:
    our notices carry no rank prefix)."""
    texts = {}
    for text in output_texts(msgs):
        first = re.search(r"^\[rank (\d+)\]", text, re.MULTILINE)
        if first is not None:
            texts[int(first.group(1))] = text
    return texts
