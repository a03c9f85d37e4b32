"""A session cell's monitor that opens pdb's prompt when one of its ranks pauses at
`breakpoint()` (runtime/live_pause.py), as `%distributed_debug` does (debug_magic.py)."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import Any

from .debug_magic import say
from .monitor import JobMonitor


class PausingMonitor(JobMonitor):
    """While the cell waits on its job, each rank paused at a `breakpoint()` gets pdb's
    prompt (the kernel's input request), one at a time, named; the cell goes on once pdb is
    left. An interrupt there interrupts the cell, which leaves pdb (jobs/session_debug.py)."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.attending = True  # (not once the cell has returned: --no-wait)
        self.seen: set[str] = set()  # the pauses looked at

    def step(self) -> bool:
        done = super().step()
        if not done and self.attending:
            from ..jobs.session_debug import attend

            with _interruptible():
                attend(self.service, self.job_id, input, say, seen=self.seen)
        return done

    def follow_in_background(self) -> Any:
        self.attending = False
        return super().follow_in_background()


@contextlib.contextmanager
def _interruptible() -> Iterator[None]:
    """An interrupt raises KeyboardInterrupt here, even in an awaited cell: there ipykernel's
    SIGINT handler only cancels the cell at the event loop's next turn, which a prompt
    waiting for its answer never gives it."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)
