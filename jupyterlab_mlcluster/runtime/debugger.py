"""`breakpoint()` in a rank.

A job's rank has no terminal: its stdin is empty and its output goes to a log, so pdb there
would either quit at once (a confusing BdbQuit) or, with a stdin that never ends, wait
forever while its peers wait in their next collective. Outside a session, `breakpoint()`
therefore fails the rank at once with an error that says what to do instead. A
`PYTHONBREAKPOINT` the user chose (`0`, or a remote debugger's hook) is honoured as Python
honours it.

In a session's rank, a failed cell's exception is kept as the interactive interpreter keeps
it (`sys.last_exc`, `sys.last_traceback`, ...), from the cell's own frames on: the next cell
can look at it, and it is what a post-mortem debugger inspects. `relay_post_mortem` runs pdb
on it, its prompt relayed through two private files to the notebook's input request or a
terminal (jobs/session_debug.py). `breakpoint()` in a session's cell pauses the rank in a
live pdb over the same kind of relay (live_pause.py). A pod's rank shares no files with the
notebook: its relay goes over its report channel and the session's channel instead
(pdb_relay.ChannelRelay), which its supervisor mirrors into such files.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from . import reporting
from .pdb_relay import IDLE_LIMIT, POLL, ChannelRelay, FileRelay, open_private

__all__ = ["IDLE_LIMIT", "POLL", "FileRelay", "open_private"]  # (the relay's, used here too)

NEEDS_SESSION = (
    "breakpoint() on rank {rank} ({where}): a debugger on a rank needs a session. This job's"
    " ranks have no terminal, so pdb here would have nobody to answer it. Run the cell in a"
    " session (`%%distributed --session NAME`): after a cell fails there,"
    " `%distributed_debug --rank R` (or `mlcluster session debug NAME --rank R`) opens pdb on"
    " rank R's traceback."
)


NO_PROMPT_HERE = (
    "breakpoint() on rank {rank} ({where}): pdb's prompt cannot reach this rank: it shares no"
    " files with the notebook, nor has it a report channel. The cell stops here, failed; the"
    " session is kept."
)
_RUNTIME = __name__.rpartition(".")[0] + "."  # this package's frames are not the cell's


class NeedsSessionError(RuntimeError):
    """breakpoint() was called in a rank of a job that is not a session."""


class NoPromptError(RuntimeError):
    """breakpoint() was called in a session's rank that no prompt can reach."""


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


class _Cell:
    """The session cell this rank runs now (session_worker.py says)."""

    directory: str | None = None  # its job directory, where a local or Slurm rank may write
    over_channel = False  # a pod's rank: pdb's prompt goes over its channels instead
    pause: Any = None  # the live pdb of a breakpoint() in it (live_pause.Pause), if any


def cell_begins(error_file: str | None) -> None:
    """A cell starts; `error_file`: where its error report goes (in its job directory),
    None for a pod's rank (no shared files)."""
    _Cell.directory = os.path.dirname(error_file) if error_file else None
    _Cell.over_channel = error_file is None and _in_pod()


def cell_ends() -> None:
    """The cell's code returned: a pdb still open there ends with it."""
    pause, _Cell.pause, _Cell.directory = _Cell.pause, None, None
    _Cell.over_channel = False
    if pause is not None:
        pause.end("the cell ended")


def pause_in_session(*args: Any, **kwargs: Any) -> Any:
    """sys.breakpointhook of a session's rank: a live pdb at the caller's line."""
    if _chosen_hook() is not None:
        return sys.__breakpointhook__(*args, **kwargs)
    if _Cell.directory is None and not _Cell.over_channel:
        raise NoPromptError(NO_PROMPT_HERE.format(**_where()))
    from . import live_pause  # (pdb: only when asked for)

    frame = sys._getframe(1)  # breakpoint() is C: the hook's caller is the user's frame
    if _Cell.pause is None:
        cell = frame  # its outermost frame: the runtime's code runs it
        while cell.f_back is not None and not is_runtime_frame(cell.f_back):
            cell = cell.f_back
        try:
            _Cell.pause = live_pause.Pause.open(_Cell.directory, frame, cell.f_back, _forget)
        except OSError as exc:
            where = _where()
            raise NoPromptError(
                f"breakpoint() on rank {where['rank']} ({where['where']}): pdb's link could"
                f" not be made in {_Cell.directory}: {exc}. The cell stops here, failed; the"
                " session is kept."
            ) from exc
    _Cell.pause.debugger.set_trace(frame)
    return None


def _in_pod() -> bool:
    return reporting.channel_mode() == "stdout"


def _forget(pause: Any) -> None:
    if _Cell.pause is pause:
        _Cell.pause = None


def arm_outside_session() -> None:
    sys.breakpointhook = refuse_outside_session


def arm_in_session() -> None:
    sys.breakpointhook = pause_in_session


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
    return is_runtime_frame(tb.tb_frame)


def is_runtime_frame(frame: Any) -> bool:
    return str(frame.f_globals.get("__name__", "")).startswith(_RUNTIME)


# -- pdb on a failed cell, over two files (jobs/session_debug.py is the other end) ----------


def _cell_of_last_failure() -> str | None:
    return getattr(sys, "_mlcluster_last_cell", None)


def keep_cell_of_failure(cell: str | None) -> None:
    sys._mlcluster_last_cell = cell  # type: ignore[attr-defined]


def relay_post_mortem(rank: int, cell: str, directory: str) -> None:
    """On rank `rank` (the others return at once): pdb on the exception `cell` left, its
    prompt over the relay in `directory`. A rank without that exception says why there."""
    if int(os.environ.get("RANK", "0")) != rank:
        return
    import pdb  # (only here: every rank imports this module)

    # (A pod's: the supervisor mirrors it into `directory`, named by its last part.)
    relay: FileRelay | ChannelRelay = (
        ChannelRelay(os.path.basename(directory), post_mortem=True)
        if _in_pod()
        else FileRelay(directory)
    )
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
