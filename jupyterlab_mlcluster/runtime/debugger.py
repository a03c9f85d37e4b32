"""`breakpoint()` in a rank.

A job's rank has no terminal: its stdin is empty and its output goes to a log, so pdb there
would either quit at once (a confusing BdbQuit) or, with a stdin that never ends, wait
forever while its peers wait in their next collective. Outside a session, `breakpoint()`
therefore fails the rank at once with an error that says what to do instead. A
`PYTHONBREAKPOINT` the user chose (`0`, or a remote debugger's hook) is honoured as Python
honours it.
"""

from __future__ import annotations

import os
import sys
from typing import Any

NEEDS_SESSION = (
    "breakpoint() on rank {rank} ({where}): a debugger on a rank needs a session. This job's"
    " ranks have no terminal, so pdb here would have nobody to answer it. Run the cell in a"
    " session (`%%distributed --session NAME`): there breakpoint() opens pdb in the notebook,"
    " and `%distributed_debug --rank R` opens one on a failed cell's traceback."
)


class NeedsSessionError(RuntimeError):
    """breakpoint() was called in a rank of a job that is not a session."""


def _chosen_hook() -> str | None:
    """The hook PYTHONBREAKPOINT names, when the user chose one other than pdb's."""
    chosen = os.environ.get("PYTHONBREAKPOINT", "")
    return None if chosen in ("", "pdb.set_trace") else chosen


def refuse_outside_session(*args: Any, **kwargs: Any) -> Any:
    """sys.breakpointhook of a rank outside a session."""
    if _chosen_hook() is not None:  # "0" (disabled) or a remote debugger: Python's own way
        return sys.__breakpointhook__(*args, **kwargs)
    caller = sys._getframe(1)
    where = f"{os.path.basename(caller.f_code.co_filename)}:{caller.f_lineno}"
    raise NeedsSessionError(NEEDS_SESSION.format(rank=os.environ.get("RANK", "0"), where=where))


def arm_outside_session() -> None:
    sys.breakpointhook = refuse_outside_session
