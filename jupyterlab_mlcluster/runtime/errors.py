"""A failing rank's report: the user's traceback, and torch.distributed.elastic's error files.

Our report (one JSON object per failed rank, the job's error and the traceback users see):
`{"rank", "exc_type", "message", "traceback", "timestamp", "pid"}`.

torchrun's workers get `TORCHELASTIC_ERROR_FILE`; a `@record`-decorated entry point writes its
failure there as `{"message": {"message": "Type: text", "extraInfo": {"py_callstack": "...",
"timestamp": "..."}}}` (torch.distributed.elastic.multiprocessing.errors.ErrorHandler). Our ranks
get the same variable pointing at their own error file, so such a report is read here too.
"""

from __future__ import annotations

import json
import os
import re
import time
import traceback
from typing import Any

_FRAME_RE = re.compile(r'^  File "(?P<file>[^"]*)", line \d+')


def hidden_frame(filename: str) -> bool:
    """Frames users never wrote: this package's runtime and the runpy that started their code."""
    path = filename.replace(os.sep, "/")
    return (
        "jupyterlab_mlcluster" in path or filename == "<frozen runpy>" or path.endswith("/runpy.py")
    )


def format_user_traceback(exc: BaseException) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    user = [f for f in frames if not hidden_frame(f.filename)]
    only = "".join(traceback.format_exception_only(type(exc), exc))
    if not user and _before_user_code(exc):
        return only  # as `python script.py` shows it: no frame ran yet
    text = "Traceback (most recent call last):\n" + "".join(traceback.format_list(user or frames))
    return text + only


def _before_user_code(exc: BaseException) -> bool:
    """A failure before any of the user's code ran: their source does not compile, or what
    travelled with it cannot be loaded (the message says what). Python shows no frames for
    the first; our frames would say nothing about either. (Any other failure in our frames
    alone keeps them: it is ours to find.)"""
    from .payload import PayloadError

    return isinstance(exc, (SyntaxError, PayloadError))


def filter_traceback_text(text: str) -> str:
    """The same filter over a traceback already formatted (another process's)."""
    out: list[str] = []
    skipping = False
    for line in text.splitlines(keepends=True):
        match = _FRAME_RE.match(line)
        if match:
            skipping = hidden_frame(match.group("file"))
        elif not line.startswith("    "):
            skipping = False  # the end of a frame: "Traceback ...", the exception line
        if not skipping:
            out.append(line)
    return "".join(out)


def from_torchelastic(data: Any, rank: int) -> dict[str, Any] | None:
    """torch.distributed.elastic's error-file JSON -> our report (None: not that format)."""
    if not isinstance(data, dict) or "message" not in data:
        return None
    body = data["message"]
    if isinstance(body, str):  # the newer flat form
        text, extra = body, data.get("extraInfo") or {}
    elif isinstance(body, dict) and isinstance(body.get("message"), str):
        text, extra = body["message"], body.get("extraInfo") or {}
    else:
        return None
    exc_type, _, message = text.partition(": ")
    callstack = extra.get("py_callstack") if isinstance(extra, dict) else None
    try:
        timestamp = float(extra.get("timestamp"))  # type: ignore[arg-type]  # None: except
    except (TypeError, ValueError, AttributeError):
        timestamp = time.time()
    return {
        "rank": rank,
        "exc_type": exc_type.strip()[:200] or "Error",
        "message": message[:10_000],
        "traceback": filter_traceback_text(str(callstack)) if callstack else text + "\n",
        "timestamp": timestamp,
        "pid": None,
    }


def read_error_file(path: str | os.PathLike[str], rank: int) -> dict[str, Any] | None:
    """A rank's error file in either form; None when absent or unreadable."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    if isinstance(data, dict) and isinstance(data.get("exc_type"), str):
        return data
    return from_torchelastic(data, rank)
