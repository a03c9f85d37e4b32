"""`mlc.log(step=None, **metrics)`: a rank's scalar series, batched onto the report channel.

A call only checks its values and appends them to a buffer (a few microseconds), so it can
be made every step. The buffer goes out as one signed record (protocol.py) at most every
FLUSH_INTERVAL, or when MAX_BATCH points or FLUSH_BYTES of encoded text wait, from the
caller or from a small daemon thread (a rank that stops logging still has its last points
sent), and at the end of the rank's code.
The record rides on the progress report (`{"type": "progress", "series": [[step, epoch ms,
{name: value}], ...], "batch": [origin, n]}`, no `step`), which every backend's supervisor
already reads; jobs/storage/series.py keeps it. `batch` numbers this process's records
(`origin` is drawn when it first logs): a supervisor that reads a rank's output again (a pod
log re-opened, a job adopted) keeps each batch once (lifecycle.RankUpdates).

Values must be finite real numbers (an int, a float, a NumPy or 0-d torch scalar); others
are dropped, and the first drop of each name says so on stderr. A job logs at most
MAX_SERIES names; past that, new names are dropped, said once.
"""

from __future__ import annotations

import json
import math
import os
import sys
import threading
import time
from typing import Any

from ..patterns import SERIES_NAME, matches
from . import reporting

FLUSH_INTERVAL = 0.5  # seconds a point may wait in the buffer
MAX_BATCH = 2000  # points in one record
# A record is one line, and a supervisor reads lines of at most 64 KiB (OutputParser's
# max_line): a batch goes out once FLUSH_BYTES wait, and a point larger than POINT_BYTES
# (many long names) goes out in pieces of at most that, so a record stays under 48 KiB.
FLUSH_BYTES = 32 * 1024
POINT_BYTES = 16 * 1024
_POINT_TEXT = 48  # the brackets, commas and time of a point, without its step and values
_VALUE_TEXT = 26  # ':' and ',' and the longest repr of a float (-1.2345678901234567e-308)
MAX_SERIES = 200  # names a job may log (the supervisor holds the job to it too)


def finite(value: Any) -> float | None:
    """`value` as a float when it is a finite real number, else None (text, bools, NaN,
    infinities, tensors of more than one element...)."""
    kind = type(value)
    if kind is float:  # the common case first (x - x is 0 for finite x, NaN otherwise)
        return value if value - value == 0.0 else None
    if isinstance(value, bool | str | bytes):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError, RuntimeError, OverflowError):
        return None
    return number if math.isfinite(number) else None


def valid_name(name: Any) -> bool:
    return isinstance(name, str) and matches(SERIES_NAME, name)


class _Log:
    """This process's buffer and what it has said; made by its first `log` (a forked child
    makes its own: _after_fork)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.sending = threading.Lock()  # held from taking the points until they are sent
        self.points: list[list[Any]] = []
        self.first_at = 0.0
        self.next_step: int | float = 0
        self.names: dict[str, int] = {}  # each name's most text in a record
        self.bytes = 0  # the most text the points waiting take
        self.said: set[str] = set()
        self.capped = False
        self.thread: threading.Thread | None = None
        self.wake = threading.Event()
        self.origin = os.urandom(4).hex()  # this process's batches (a forked child: its own)
        self.sent = 0  # records sent, under `sending`

    def say(self, key: str, text: str) -> None:
        if key not in self.said:
            self.said.add(key)
            print(f"[mlcluster] mlc.log: {text}", file=sys.stderr, flush=True)

    def checked(self, step: Any, metrics: dict[str, Any]) -> dict[str, float]:
        """The metrics that are kept: finite values of valid names, within MAX_SERIES;
        the first drop of each name is said."""
        clean: dict[str, float] = {}
        names = self.names
        for name, value in metrics.items():
            if type(value) is float and value - value == 0.0 and name in names:
                clean[name] = value  # the common case: a finite float of a known series
                continue
            number = finite(value)
            if number is None:
                self.say(
                    f"value:{name}",
                    f"dropped {name}={value!r} at step {step} (not a finite number); "
                    f"later drops of {name!r} are not reported",
                )
            elif name in names or self._admit(name):
                clean[name] = number
        return clean

    def _admit(self, name: str) -> bool:
        """A new series' name: valid, and within MAX_SERIES (its size noted)."""
        if not valid_name(name):
            self.say(f"name:{name}", f"dropped series {name!r} (a name has no comma)")
            return False
        if len(self.names) >= MAX_SERIES:
            if not self.capped:
                self.capped = True
                self.say(
                    "cap",
                    f"a job logs at most {MAX_SERIES} series; {name!r} and any further "
                    "new names are dropped",
                )
            return False
        self.names[name] = len(json.dumps(name)) + _VALUE_TEXT
        return True

    def advance(self, step: Any) -> int | float:
        """`step` as it is recorded (an int, else a float); the default step is one past it."""
        if type(step) is int:
            self.next_step = step + 1
            return step
        step = float(step)
        self.next_step = int(step) + 1 if step.is_integer() else step + 1
        return step

    def add(self, step: int | float, clean: dict[str, float]) -> bool:
        """Buffer one point (in pieces when too large for one record), sending what waits
        once a batch is full. True if the last piece filled one."""
        now = time.time()
        at = int(now * 1000)  # the time in ms: cheaper text
        base = _POINT_TEXT + len(repr(step))
        size = base
        for name in clean:
            size += self.names[name]
        pieces = [(clean, size)] if size <= POINT_BYTES else _split(clean, self.names, base)
        full = False
        for values, size in pieces:
            with self.lock:
                if not self.points:
                    self.first_at = now
                self.points.append([step, at, values])
                self.bytes += size
                full = (
                    len(self.points) >= MAX_BATCH
                    or self.bytes >= FLUSH_BYTES
                    or now - self.first_at >= FLUSH_INTERVAL
                )
            if full:
                flush()
        return full


# Made by the first `log`, not at import: the server and the supervisor import this module
# (jobs/storage/series.py) and never log, and a process that never logs has no fork hook.
_state: _Log | None = None
_fork_hook = False  # registered once per process (a forked child inherits it)
_beginning = threading.Lock()  # two threads' first calls make one buffer


def _begin() -> _Log:
    global _state, _fork_hook
    with _beginning:
        if _state is None:
            _state = _Log()
        if not _fork_hook:
            _fork_hook = True
            os.register_at_fork(after_in_child=_after_fork)
        return _state


def log(step: float | None = None, **metrics: Any) -> None:
    """Log scalars of this rank at `step` (default: one past this rank's last step).

    Shown as curves in the job's monitor, kept with the job (`job.metrics()`, `mlcluster
    metrics JOB`, GET /jobs/{id}/metrics?series=...) and sent to MLflow with --track mlflow.
    Outside a distributed job it does nothing."""
    if reporting.channel_mode() == "none":
        return
    state = _state or _begin()
    if step is None:
        step = state.next_step
    elif type(step) is not int and finite(step) is None:
        state.say(f"step:{step!r}", f"dropped a call whose step {step!r} is not a finite number")
        return
    clean = state.checked(step, metrics)
    step = state.advance(step)
    if clean and not state.add(step, clean) and state.thread is None:
        _start_thread(state)


def _split(
    clean: dict[str, float], sizes: dict[str, int], base: int
) -> list[tuple[dict[str, float], int]]:
    """A point too large for one record as pieces of at most POINT_BYTES (the store puts
    them together again: they share the step)."""
    pieces: list[tuple[dict[str, float], int]] = []
    values: dict[str, float] = {}
    size = base
    for name, value in clean.items():
        if values and size + sizes[name] > POINT_BYTES:
            pieces.append((values, size))
            values, size = {}, base
        values[name] = value
        size += sizes[name]
    pieces.append((values, size))
    return pieces


def flush() -> None:
    """Send what waits now (the runtime calls it when the rank's code ends). Returns once
    what the flusher thread took is sent too: the rank may exit right after."""
    state = _state
    if state is None:  # nothing was logged
        return
    with state.sending:
        with state.lock:
            points, state.points = state.points, []
            state.bytes = 0
        if points:
            batch = [state.origin, state.sent]
            state.sent += 1
            reporting.send({"type": "progress", "series": points, "batch": batch})


def _start_thread(state: _Log) -> None:
    with state.lock:
        if state.thread is not None:
            return
        state.thread = threading.Thread(target=_flusher, args=(state,), name="mlc.log", daemon=True)
    state.thread.start()


def _flusher(state: _Log) -> None:
    while not state.wake.wait(FLUSH_INTERVAL):
        with state.lock:
            due = bool(state.points) and time.time() - state.first_at >= FLUSH_INTERVAL
        if due:
            flush()


def _after_fork() -> None:
    global _state
    _state = None  # a forked child (a DataLoader worker) sends nothing of its parent's


# No atexit hook: the rank's runtime flushes when the user's code ends, however it ends
# (runtime/worker.py), and a hook registered here would be one more exit handler than a
# torchrun worker has (twice over in a warm rank, which imports this module again).
