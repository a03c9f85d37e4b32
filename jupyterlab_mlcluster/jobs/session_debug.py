"""pdb on a session's rank, from the notebook (`%distributed_debug`) or a terminal
(`mlcluster session debug`): a post-mortem on the traceback of the session's last failed cell.

The debugger runs as a cell of the session (so interrupting it, cancelling it and the
session's own end work as for any cell): on the chosen rank, pdb inspects the exception that
rank kept (runtime/debugger.py) with its stdin and stdout on two files in a directory of the
session's (the user's store, mode 0700); here each line pdb prints is said, and each time it
waits for a line the caller is asked (the kernel's input request, or the terminal). Leaving
pdb (`q`, `c`, end of input) ends the cell; the session and its ranks' state are kept.

Bad use changes nothing: an unknown session, a rank out of range, a session without a failed
cell are refused before any cell is sent.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from .model import JobState
from .sessions import SessionError, get_session, list_sessions, submit_cell

if TYPE_CHECKING:
    from .record import JobRecord
    from .service import JobService

POLL = 0.05
FILE_BACKENDS = ("local", "slurm")  # the rank reads the session's directory (not a pod)


def last_failed_cell(service: JobService, holder: JobRecord) -> JobRecord | None:
    """The session's last failed cell (a debugger's own cells aside)."""
    for cell_id in reversed(service.store.session_cells(holder.id, [str(JobState.FAILED)])):
        cell = service.store.get_job(cell_id)
        if not cell.origin.get("debug_of"):
            return cell
    return None


def debug(
    service: JobService,
    owner: str | None,
    name: str | None,
    rank: int | None,
    *,
    origin: dict,
    ask: Callable[[str], str],
    say: Callable[[str], None],
) -> str:
    """Run pdb on `rank` (default: the rank that failed first) of session `name`'s last
    failed cell until it is left; what to say at the end. SessionError: bad use. `name`
    None: the user's only live session."""
    if name is None:
        live = [info.name for info in list_sessions(service, owner)]
        if len(live) != 1:
            raise SessionError(
                "which session? name it (--session NAME): "
                + (f"the live ones are {', '.join(live)}" if live else "there is no live session")
                + "; a debugger on a rank needs a session (%%distributed --session NAME)"
            )
        name = live[0]
    info = get_session(service, owner, name)
    holder = info.holder
    if holder.spec.backend not in FILE_BACKENDS:
        raise SessionError(
            f"session {name!r} runs on {holder.spec.backend}: the debugger reaches ranks of"
            f" {' and '.join(FILE_BACKENDS)} sessions only, for now"
        )
    failed = last_failed_cell(service, holder)
    if failed is None:
        raise SessionError(f"session {name!r} has no failed cell to debug")
    if rank is None:
        rank = failed.failed_rank if failed.failed_rank is not None else 0
    if not 0 <= rank < holder.spec.workers:
        raise SessionError(
            f"--rank {rank}: session {name!r} has ranks 0 to {holder.spec.workers - 1}"
        )
    directory = _relay_directory(service, holder)
    from ..runtime.payload import Payload

    source = (
        '__import__("jupyterlab_mlcluster.runtime.debugger", fromlist=["_"])'
        f".relay_post_mortem({rank}, {failed.id!r}, {directory!r})\n"
    )
    record, _ = submit_cell(
        service,
        name,
        {"name": f"debug-rank{rank}"},
        Payload(kind="code", source=source, cwd=os.getcwd()),
        origin={**origin, "debug_of": failed.id},
    )
    say(f"pdb on rank {rank}, at the failure of cell {failed.name} ({failed.id}):\n")
    try:
        return _relay(service, record.id, directory, ask, say)
    finally:
        for part in ("in", "out"):
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(directory, part))
        with contextlib.suppress(OSError):
            os.rmdir(directory)


def _relay_directory(service: JobService, holder: JobRecord) -> str:
    base = service.store.job_dir(holder.id) / "debug"
    base.mkdir(mode=0o700, exist_ok=True)
    directory = base / secrets.token_hex(8)
    directory.mkdir(mode=0o700)
    for part in ("in", "out"):
        os.close(os.open(directory / part, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    return str(directory)


def _relay(
    service: JobService,
    cell_id: str,
    directory: str,
    ask: Callable[[str], str],
    say: Callable[[str], None],
) -> str:
    typed = os.open(os.path.join(directory, "in"), os.O_WRONLY | os.O_APPEND)
    error = None
    pending = ""  # what pdb printed since its last newline: the prompt, when it asks
    try:
        with open(os.path.join(directory, "out"), "rb") as out:
            buffered, ended = b"", False
            while not ended:
                chunk = out.read()
                if not chunk:
                    record = service.store.get_job(cell_id)
                    if record.final:
                        if record.state != JobState.SUCCEEDED:
                            reason = record.error or record.reason or str(record.state)
                            raise SessionError(f"the debugger's cell ended: {reason}")
                        break
                    time.sleep(POLL)
                    continue
                buffered += chunk
                while b"\n" in buffered:
                    line, _, buffered = buffered.partition(b"\n")
                    message = json.loads(line)
                    if "out" in message:
                        text = pending + message["out"]
                        done, _, pending = text.rpartition("\n")
                        if done:
                            say(done + "\n")
                    elif message.get("ask"):
                        try:
                            answer = ask(pending)
                        except (EOFError, KeyboardInterrupt):
                            answer = "q"
                        pending = ""
                        os.write(typed, answer.replace("\n", " ").encode() + b"\n")
                    elif "error" in message:
                        error = str(message["error"])
                    elif message.get("end"):
                        ended = True
    except BaseException:
        # (A kernel's interrupt, a refused cell: pdb must not wait for lines nobody types.)
        with contextlib.suppress(Exception):
            service.cancel(cell_id, wait=False)
        raise
    finally:
        os.close(typed)
    service.wait(cell_id, timeout=60)
    if error:
        raise SessionError(error)
    return "left pdb; the session and its state are kept"
