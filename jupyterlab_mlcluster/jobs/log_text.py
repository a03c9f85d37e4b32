"""A job's log lines as people read them: `[rank N] text` for what a rank printed; our own
notices (the `system` stream: stopping, restarts, kills) as they are, without a rank's
prefix, since they are the job's and name a rank themselves where one is meant. A job-level
notice is written into every rank's log file (each file tells the whole story), so the
same text from other ranks is shown once. Used by every front end that prints logs (the
CLI, `Job.logs()`, the kernel's `%distributed_logs` and its plain-text monitor)."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

SYSTEM_STREAM = "system"
_REMEMBERED = 256  # recent notices looked at for repeats (a restart's arrive together)


def line_text(line: dict[str, Any]) -> str:
    """One line as shown, on its own (a rank's own view: its notices too)."""
    if line.get("stream") == SYSTEM_STREAM:
        return str(line["line"])
    return f"[rank {line['rank']}] {line['line']}"


class LogText:
    """One reader's view of a job's log lines, across calls (a follower's batches)."""

    def __init__(self) -> None:
        self._notices: OrderedDict[str, set[int]] = OrderedDict()

    def text(self, line: dict[str, Any]) -> str | None:
        """The line as shown (no newline); None: a notice already shown for another rank."""
        if line.get("stream") != SYSTEM_STREAM:
            return line_text(line)
        text, rank = str(line["line"]), line["rank"]
        ranks = self._notices.get(text)
        if ranks is not None and rank not in ranks:
            ranks.add(rank)  # the same notice in another rank's file
            return None
        self._notices[text] = {rank}  # new, or this rank's own again: shown
        self._notices.move_to_end(text)
        while len(self._notices) > _REMEMBERED:
            self._notices.popitem(last=False)
        return text

    def lines(self, lines: list[dict[str, Any]]) -> list[tuple[dict[str, Any], str]]:
        """Each line to show, with its text."""
        shown = []
        for line in lines:
            text = self.text(line)
            if text is not None:
                shown.append((line, text))
        return shown


def logs_text(lines: list[dict[str, Any]]) -> str:
    """Lines as one text (each ending in a newline)."""
    return "".join(f"{text}\n" for _, text in LogText().lines(lines))
