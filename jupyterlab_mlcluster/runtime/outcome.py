"""What a rank reports of its run: rank 0's result (the pickle only its owner's kernel or
process reads, and its JSON form that servers serve, both also sent as signed chunks on
stdout where the supervisor cannot read the rank's files) and a failed rank's error report.
Used by every rank's entry: runtime/worker.py (a job's) and runtime/session_worker.py (a
session's cells).
"""

from __future__ import annotations

import base64
import contextlib
import errno
import json
import os
import sys
import time
from typing import Any

from . import errors, reporting
from .atomic import write_whole

RESULT_CHUNK = 48 * 1024  # bytes of base64 per stdout record; keeps log lines modest
MIB = 1024 * 1024
# Results pickled bigger than this get no JSON form (REST's GET /jobs/{id}/result says so):
# encoding one costs the rank time every job pays for a read few make (a list of 120k floats,
# 1 MiB pickled, takes ~0.1 s to encode; tensors and arrays fail at once).
JSON_FORM_MAX = 1 * MIB
RESULT_JSON_NAME = "result.json"  # beside MLCLUSTER_RESULT_PATH


class ResultError(RuntimeError):
    """Rank 0 could not send its result back (undefined --pull name, unpicklable value)."""


def write_result(kind: str, value: Any) -> None:
    """Rank 0's result, twice: the pickle only the owner's kernel or process reads, and its
    JSON form (or the types that have none) that servers serve: a server never unpickles,
    since whoever wrote the job chose what the unpickling would run."""
    import cloudpickle

    try:
        data = cloudpickle.dumps({"kind": kind, "value": value})
    except Exception as exc:  # noqa: BLE001
        raise ResultError(
            f"cannot send the result back to the kernel: {type(exc).__name__}: {exc}"
        ) from None
    limit = max_result_bytes()
    if limit and len(data) > limit:
        raise ResultError(
            f"the result is {len(data) / MIB:.1f} MiB, more than this job may return "
            f"({limit / MIB:g} MiB, MLClusterConfig.max_result_mib): save it to a file instead"
        )
    json_form = result_json(kind, value, len(data))
    path = os.environ.get("MLCLUSTER_RESULT_PATH")
    if path:
        # Beside the pickle, whichever backend named it (JobStore.result_json_path).
        json_path = os.path.join(os.path.dirname(path), RESULT_JSON_NAME)
        try:
            write_whole(json_path, json_form)
            try:
                write_whole(path, data)
            except BaseException:
                with contextlib.suppress(OSError):  # no half of a result
                    os.unlink(json_path)
                raise
        except OSError as exc:
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            raise ResultError(
                f"no space left on the device holding {path}: the result"
                f" ({len(data)} bytes) cannot be written ({exc.strerror})"
            ) from None
        return
    # The JSON form first: the pickle's last chunk completes the result.
    _send_chunks(json_form, "json")
    _send_chunks(data, None)


def _send_chunks(data: bytes, form: str | None) -> None:
    encoded = base64.b64encode(data).decode()
    chunks = [encoded[i : i + RESULT_CHUNK] for i in range(0, len(encoded), RESULT_CHUNK)] or [""]
    for index, chunk in enumerate(chunks):
        record = {"type": "result", "index": index, "count": len(chunks), "data": chunk}
        if form:
            record["form"] = form
        reporting.send(record)


def max_result_bytes() -> int:
    """The job's cap on its pickled result (MLCLUSTER_MAX_RESULT_BYTES, set by the backend;
    0 or unset: none)."""
    try:
        return max(0, int(os.environ.get("MLCLUSTER_MAX_RESULT_BYTES", "0")))
    except ValueError:
        return 0


def result_json(kind: str, value: Any, pickled_size: int) -> bytes:
    """{"kind", "value"} where the value has a JSON form, else {"kind", "types"} saying
    which types have none (what a server's 409 says). A value whose pickle is bigger than
    JSON_FORM_MAX is not encoded twice (that would slow every big result for a REST read
    few make)."""
    if pickled_size <= JSON_FORM_MAX:
        try:
            return json.dumps({"kind": kind, "value": value}, allow_nan=False).encode()
        except (TypeError, ValueError, RecursionError):
            pass
        return json.dumps({"kind": kind, "types": _type_names(value)}).encode()
    return json.dumps(
        {
            "kind": kind,
            "types": f"{_type_names(value)}, {pickled_size / MIB:.1f} MiB pickled (more than "
            f"{JSON_FORM_MAX // MIB} MiB)",
        }
    ).encode()


def _type_names(value: Any) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{k}: {type(v).__name__}" for k, v in value.items())
    return type(value).__name__


MESSAGE_MAX = 16 * 1024  # characters of an exception's message kept in its report
TRACEBACK_MAX = 64 * 1024  # characters of its traceback kept (the end: where it was raised)


def _cut(text: str, most: int) -> str:
    if len(text) <= most:
        return text
    end = "\n" if text.endswith("\n") else ""
    return f"{text[:most]}… ({len(text.rstrip(chr(10))) - most} characters more){end}"


def error_report(rank: int, exc: BaseException) -> dict[str, Any]:
    # Only the user's frames: not the runtime's, not runpy's (`python script.py` has neither).
    # Bounded: a pod sends it as one log line, which its supervisor reads up to a limit (past
    # it, the line is raw text and the report of an exception with a huge repr is lost).
    message = _cut(str(exc), MESSAGE_MAX)
    traceback = "".join(
        _cut(line, MESSAGE_MAX) for line in errors.format_user_traceback(exc).splitlines(True)
    )
    if len(traceback) > TRACEBACK_MAX:  # the end: where it was raised, and what
        cut = len(traceback) - TRACEBACK_MAX
        traceback = f"({cut} characters of the traceback before)…\n{traceback[-TRACEBACK_MAX:]}"
    return {
        "rank": rank,
        "exc_type": type(exc).__name__,
        "message": message,
        "traceback": traceback,
        "timestamp": time.time(),
        "pid": os.getpid(),
    }


def exit_report(rank: int, code: Any) -> dict[str, Any]:
    """A non-zero sys.exit: what `@record` wrote before it (torchrun's root cause), if any."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    recorded = errors.read_error_file(path, rank) if path else None
    if recorded is not None:
        return {**recorded, "pid": os.getpid()}
    return {
        "rank": rank,
        "exc_type": "SystemExit",
        "message": f"exit status {code}",
        "traceback": f"SystemExit: {code}\n",
        "timestamp": time.time(),
        "pid": os.getpid(),
    }


def write_error(report: dict[str, Any]) -> None:
    path = os.environ.get("MLCLUSTER_ERROR_FILE")
    if path:
        try:
            write_whole(path, json.dumps(report).encode())
            return
        except OSError as exc:
            # A full disk: the report goes over the report channel instead (the supervisor
            # keeps it in memory), so the job still says why this rank failed.
            print(f"mlcluster: cannot write {path}: {exc}", file=sys.stderr)
    reporting.send({"type": "error", **report})
