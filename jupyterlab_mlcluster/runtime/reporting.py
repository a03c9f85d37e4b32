"""The rank side of the report channel (see protocol.py): `progress()` and friends
(`mlc.log` batches onto it: scalars.py)."""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any

from .protocol import encode_record, key_path, read_key_file

_lock = threading.Lock()
_last_progress = 0.0
_fd: int | None = None
_mode: str | None = None
_key: bytes | None = None
_rank = 0


def configure(rank: int | None = None) -> None:
    """Read this rank's channel, rank and job key (beside its payload). The runtime calls it
    before the user's code runs; the key stays in this module, never in the environment.
    `rank`: whose records these are, where $RANK does not say (a pod's first step)."""
    global _mode, _fd, _key, _rank
    setting = os.environ.get("MLCLUSTER_REPORT", "")
    payload = os.environ.get("MLCLUSTER_PAYLOAD")
    _key = read_key_file(key_path(payload)) if payload else None
    _rank = int(os.environ.get("RANK", "0") or 0) if rank is None else rank
    if _key is None:
        _mode = "none"  # nobody would believe an unsigned record
    elif setting.startswith("fd:"):
        _mode, _fd = "fd", int(setting[3:])
    elif setting == "stdout":
        _mode = "stdout"
    else:
        _mode = "none"


def _channel() -> tuple[str, int | None]:
    """('fd', n) for a local rank, ('stdout', None) in a pod, ('none', None) outside a job."""
    if _mode is None:
        configure()
    return _mode, _fd  # type: ignore[return-value]


def channel_mode() -> str:
    """'fd', 'stdout', or 'none' (outside a job: reports go nowhere)."""
    return _channel()[0]


def send(record: dict[str, Any]) -> bool:
    mode, fd = _channel()
    if mode == "none":
        return False
    data = encode_record(record, _key, _rank)  # type: ignore[arg-type]
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
