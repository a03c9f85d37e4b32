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
The prompt that pdb on a session's rank answers through (the notebook's input request) is
not built yet, so `breakpoint()` in a session cell says so rather than quitting pdb at once.
"""

from __future__ import annotations

import os
import sys
from typing import Any

NEEDS_SESSION = (
    "breakpoint() on rank {rank} ({where}): a debugger on a rank needs a session. This job's"
    " ranks have no terminal, so pdb here would have nobody to answer it. Run the cell in a"
    " session (`%%distributed --session NAME`), whose ranks keep a failed cell's exception"
    " (sys.last_exc, sys.last_traceback) for the next cell to look at."
)


NO_PROMPT_YET = (
    "breakpoint() on rank {rank} ({where}): this version cannot yet open pdb's prompt from a"
    " session's rank in the notebook. The cell stops here; after it, each rank keeps the"
    " failed cell's exception in sys.last_exc / sys.last_traceback for the next cell."
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
    sys.last_exc = exc  # (Python 3.12's name; harmless before)


def _ours(tb: Any) -> bool:
    return str(tb.tb_frame.f_globals.get("__name__", "")).startswith(_RUNTIME)
