"""`breakpoint()` in a rank.

A job's rank has no terminal: its stdin is empty and its output goes to a log, so pdb there
would either quit at once (a confusing BdbQuit) or, with a stdin that never ends, wait
forever while its peers wait in their next collective. Outside a session, `breakpoint()`
therefore fails the rank at once with an error that says what to do instead. A
`PYTHONBREAKPOINT` the user chose (`0`, or a remote debugger's hook) is honoured as Python
honours it.

In a session's rank, a failed cell's exception is kept as the interactive interpreter keeps
it (`sys.last_exc`, `sys.last_type`, `sys.last_value`, `sys.last_traceback`), from the cell's
own frames on: the next cell can look at it, and it is what a post-mortem debugger inspects.
`relay_post_mortem` runs pdb on it, its prompt relayed through two private files to the
notebook's input request or a terminal (jobs/session_debug.py). Pausing a live rank at
`breakpoint()` is not built yet: in a session cell it fails the cell, saying so, and the
post-mortem then opens at that very line.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import sys
import time
from typing import Any

NEEDS_SESSION = (
    "breakpoint() on rank {rank} ({where}): a debugger on a rank needs a session. This job's"
    " ranks have no terminal, so pdb here would have nobody to answer it. Run the cell in a"
    " session (`%%distributed --session NAME`): after a cell fails there,"
    " `%distributed_debug --rank R` (or `mlcluster session debug NAME --rank R`) opens pdb on"
    " rank R's traceback."
)


NO_PROMPT_YET = (
    "breakpoint() on rank {rank} ({where}): this version cannot yet open pdb's prompt from a"
    " session's rank in the notebook. The cell stops here, failed: `%distributed_debug --rank"
    " {rank}` opens pdb at this line (a post-mortem), and the session is kept."
)
_RUNTIME = __name__.rpartition(".")[0] + "."  # this package's frames are not the cell's


class NeedsSessionError(RuntimeError):
    """breakpoint() was called in a rank of a job that is not a session."""


class NoPromptError(RuntimeError):
    """breakpoint() was called in a session's cell, where no prompt reaches yet."""


def _chosen_hook() -> str | None:
    """The hook PYTHONBREAKPOINT names, when the user chose one other than pdb's."""
    chosen = os.environ.get("PYTHONBREAKPOINT", "")
    return None if chosen in ("", "pdb.set_trace") else chosen


def _where() -> dict[str, str]:
    caller = sys._getframe(2)  # the hook called by breakpoint() (C: no frame) <- this
    where = f"{os.path.basename(caller.f_code.co_filename)}:{caller.f_lineno}"
    return {"rank": os.environ.get("RANK", "0"), "where": where}


def refuse_outside_session(*args: Any, **kwargs: Any) -> Any:
    """sys.breakpointhook of a rank outside a session."""
    if _chosen_hook() is not None:  # "0" (disabled) or a remote debugger: Python's own way
        return sys.__breakpointhook__(*args, **kwargs)
    raise NeedsSessionError(NEEDS_SESSION.format(**_where()))


def refuse_in_session(*args: Any, **kwargs: Any) -> Any:
    """sys.breakpointhook of a session's rank, until its prompt is built."""
    if _chosen_hook() is not None:
        return sys.__breakpointhook__(*args, **kwargs)
    raise NoPromptError(NO_PROMPT_YET.format(**_where()))


def arm_outside_session() -> None:
    sys.breakpointhook = refuse_outside_session


def arm_in_session() -> None:
    sys.breakpointhook = refuse_in_session


def keep_last_failure(exc: BaseException) -> None:
    """A failed cell's exception, where the interactive interpreter keeps one, its
    traceback starting at the cell's own frames."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None and _ours(tb):
        tb = tb.tb_next
    exc = exc.with_traceback(tb)
    sys.last_type, sys.last_value, sys.last_traceback = type(exc), exc, tb
    sys.last_exc = exc  # type: ignore[attr-defined,unused-ignore]  # (3.12+)
    keep_cell_of_failure(os.environ.get("MLCLUSTER_JOB_CELL"))


def _ours(tb: Any) -> bool:
    return str(tb.tb_frame.f_globals.get("__name__", "")).startswith(_RUNTIME)


# -- pdb on a failed cell, over two files (jobs/session_debug.py is the other end) ----------

POLL = 0.05  # how often the rank looks for the next line typed
IDLE_LIMIT = 1800.0  # nobody typed for this long: pdb ends, and the rank takes cells again


def _cell_of_last_failure() -> str | None:
    return getattr(sys, "_mlcluster_last_cell", None)


def keep_cell_of_failure(cell: str | None) -> None:
    sys._mlcluster_last_cell = cell  # type: ignore[attr-defined]


class FileRelay:
    """pdb's stdin and stdout for a session's rank: what it prints goes to `out` as JSON
    lines ({"out": text}, {"ask": true} when it waits for a line, {"error": text},
    {"end": true}); what is typed comes as lines appended to `lines`. Both files were made
    by their owner, this rank's user, in a directory only that user can enter."""

    def __init__(self, directory: str, idle_limit: float = IDLE_LIMIT):
        self.out = _open_private(os.path.join(directory, "out"), os.O_WRONLY | os.O_APPEND)
        self.lines = os.fdopen(_open_private(os.path.join(directory, "in"), os.O_RDONLY), "rb")
        self.idle_limit, self.buffered = idle_limit, b""

    def send(self, **record: Any) -> None:
        os.write(self.out, json.dumps(record).encode() + b"\n")

    def write(self, text: str) -> int:
        if text:
            self.send(out=text)
        return len(text)

    def flush(self) -> None:
        pass

    def readline(self) -> str:
        """The next line typed; "" (pdb's end of input) once nobody typed for the limit."""
        self.send(ask=True)
        deadline = time.monotonic() + self.idle_limit
        while b"\n" not in self.buffered:
            chunk = self.lines.read()
            if chunk:
                self.buffered += chunk
                continue
            if time.monotonic() > deadline:
                self.send(out=f"\nnothing typed for {self.idle_limit:g} s: leaving pdb\n")
                return ""
            time.sleep(POLL)
        line, _, self.buffered = self.buffered.partition(b"\n")
        return line.decode(errors="replace") + "\n"

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.send(end=True)
        with contextlib.suppress(OSError):
            os.close(self.out)
        self.lines.close()


def _open_private(path: str, flags: int) -> int:
    """`path`, only if it is a plain file of this user that nobody else may write (whoever
    writes the typed lines drives pdb: runs code as this user)."""
    fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC)
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o022:
        os.close(fd)
        raise PermissionError(f"{path}: not a private file of this user; no debugger")
    return fd


def relay_post_mortem(rank: int, cell: str, directory: str) -> None:
    """On rank `rank` (the others return at once): pdb on the exception `cell` left, its
    prompt over the relay in `directory`. A rank without that exception says why there."""
    if int(os.environ.get("RANK", "0")) != rank:
        return
    import pdb  # (only here: every rank imports this module)

    relay = FileRelay(directory)
    try:
        tb = getattr(sys, "last_traceback", None)
        if tb is None or _cell_of_last_failure() != cell:
            relay.send(
                error=f"rank {rank} did not fail in the session's last failed cell ({cell}):"
                " it has no traceback of it to debug"
            )
            return
        debugger = pdb.Pdb(stdin=relay, stdout=relay)  # type: ignore[arg-type]
        debugger.reset()
        debugger.interaction(None, tb)
    finally:
        relay.close()
