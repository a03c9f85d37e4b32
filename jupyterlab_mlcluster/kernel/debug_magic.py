"""`%distributed_debug`: pdb on a session's rank, its prompt the notebook's input request
(jobs/session_debug.py does the work; `mlcluster session debug` is the terminal's; a rank
paused at `breakpoint()` gets it from pause_prompt.py)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from IPython.core import magic_arguments
from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_magic, magics_class


@magics_class
class DebugMagics(Magics):
    def __init__(self, shell: Any, service: Callable[[], Any], origin: Callable[[], dict]):
        # (magics.py's: this module never imports it back)
        super().__init__(shell)
        self.service, self.origin = service, origin

    @magic_arguments.magic_arguments()
    @magic_arguments.argument(
        "--rank", type=int, default=None, help="the rank (default: the one that failed first)"
    )
    @magic_arguments.argument(
        "--session", default=None, help="the session (default: your only live one)"
    )
    @line_magic
    def distributed_debug(self, line: str) -> None:
        """pdb on rank R's traceback of the session's last failed cell (post-mortem), its
        prompt below the cell. `q` or `c` leaves it; the session and its state are kept."""
        from ..jobs.model import SpecError
        from ..jobs.owner import current_user
        from ..jobs.session_debug import debug

        args = magic_arguments.parse_argstring(self.distributed_debug, line)
        try:
            end = debug(
                self.service(),
                current_user(),
                args.session,
                args.rank,
                origin=self.origin(),
                ask=input,
                say=say,
            )
        except SpecError as exc:
            raise UsageError(f"%distributed_debug: {exc}") from None
        print(end)


def say(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()
