"""The rank's side of stack taking (jobs/forensics/): a helper that writes every thread's
stack on request, and the pause a failing rank makes so its peers' stacks can be read.

The helper is for where the supervisor cannot read the rank from outside (ptrace refused:
a pod without SYS_PTRACE, no py-spy). It is `faulthandler.register(SIGUSR2)`: a C-level
handler that dumps all threads without the GIL, so it answers while the main thread is
blocked in a collective or spins holding the GIL. Registering a SIGUSR2 handler in the rank
is deliberate: it is armed only when the launcher asks ($MLCLUSTER_STACKS_FILE, set where
MLClusterConfig.stacks_helper is on), only while nobody else has claimed SIGUSR2 (the
default action is the only one it replaces), and a program's own `signal.signal(SIGUSR2,
...)` later simply takes the signal back (the reader then says the helper did not answer).

The pause ($MLCLUSTER_FAILURE_ACK): a rank whose code raised tells the supervisor
("failing", on its report channel) and waits, at most FAILURE_ACK_WAIT, for the supervisor's
file saying it has read the other ranks: once this rank exits its sockets close and the
peers waiting for it in a collective fail too, so their stacks must be read first.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import threading
import time
from pathlib import Path

STACKS_FILE_ENV = "MLCLUSTER_STACKS_FILE"
FAILURE_ACK_ENV = "MLCLUSTER_FAILURE_ACK"
HELPER_SIGNAL = signal.SIGUSR2
FAILURE_ACK_WAIT = 5.0


def main_ident_path(stacks_file: str | Path) -> Path:
    """Where the helper says which thread is the main one (faulthandler names none)."""
    return Path(f"{stacks_file}.main")


def arm() -> bool:
    """Register the helper when the launcher asked for it (a pod's rank: stack_port.py's);
    False where it is not armed."""
    path = os.environ.get(STACKS_FILE_ENV)
    if not path and os.environ.get("MLCLUSTER_REPORT") == "stdout":
        from .stack_port import listen  # a pod's rank: asked over its pod's network

        return listen(FAILURE_ACK_ENV)
    if not path or signal.getsignal(HELPER_SIGNAL) is not signal.SIG_DFL:
        return False
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags, 0o600)
        main_ident_path(path).write_text(str(threading.main_thread().ident))
    except OSError:
        return False
    # The fd stays open for the rank's life: faulthandler writes to it from the handler.
    faulthandler.register(HELPER_SIGNAL, file=fd, all_threads=True, chain=False)
    return True


def hold_for_peers(send) -> None:
    """A failing rank: tell the supervisor (`send`, the report channel) and wait for its
    word that the other ranks' stacks were read (bounded), before going on to exit."""
    ack = os.environ.get(FAILURE_ACK_ENV)
    if not ack or not send({"type": "failing", "time": time.time()}):
        return
    deadline = time.monotonic() + FAILURE_ACK_WAIT
    while time.monotonic() < deadline and not os.path.exists(ack):
        time.sleep(0.01)
