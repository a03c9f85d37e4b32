"""The rank side of the report channel (see protocol.py): `progress()` and friends."""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any

from .protocol import encode_record

_lock = threading.Lock()
_last_progress = 0.0
_fd: int | None = None
_mode: str | None = None


def _channel() -> tuple[str, int | None]:
    """('fd', n) for a local rank, ('stdout', None) in a pod, ('none', None) outside a job."""
    global _mode, _fd
    if _mode is None:
        setting = os.environ.get("MLCLUSTER_REPORT", "")
        if setting.startswith("fd:"):
            _mode, _fd = "fd", int(setting[3:])
        elif setting == "stdout":
            _mode = "stdout"
        else:
            _mode = "none"
    return _mode, _fd


def send(record: dict[str, Any]) -> bool:
    mode, fd = _channel()
    if mode == "none":
        return False
    data = encode_record(record)
    with _lock:
        if mode == "fd":
            try:
                os.write(fd, data)  # type: ignore[arg-type]
            except OSError:
                return False
        else:
            out = sys.__stdout__
            if out is None:
                return False
            sys.stdout.flush()
            out.flush()
            out.buffer.write(b"\n" + data)  # leading newline: never glued to a partial line
            out.flush()
    return True


def progress(step: float, total: float | None = None, desc: str | None = None) -> None:
    """Report this rank's progress; shown as a progress bar in the job monitor.

    Call it as often as you like: reports are sent at most ten times a second (the last
    step always goes through). Outside a distributed job it does nothing.
    """
    global _last_progress
    now = time.monotonic()
    done = total is not None and step >= total
    if not done and now - _last_progress < 0.1:
        return
    _last_progress = now
    send({"type": "progress", "step": step, "total": total, "desc": desc})
