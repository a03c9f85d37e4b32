"""Ports a job's ranks will listen on (MASTER_PORT, JAX's coordinator, TensorFlow's workers),
chosen where no other program on the machine will be given them.

A port merely found free (bind port 0, close, hand the number on) is anyone's again at once,
and CI saw rank 0's TCPStore fail with EADDRINUSE twice: once the kernel gave the port to
another connection, once (with the port already held from connections) another program that
had found the same port free a moment earlier bound it. Jupyter's kernels are such programs:
jupyter_client finds five ports free and the kernel binds them a second or two later. So:

1. A job's port is outside the kernel's ephemeral range (net.ipv4.ip_local_port_range). The
   kernel never gives such a port to a connection or to a `bind(0)`, and every program that
   finds a port free finds it inside that range. (torchrun's multi-node default, 29500, is
   outside it for the same reason.)
2. It is held: bound without SO_REUSEADDR first, so that one in use, or held by another job's
   choice, is refused; then left in TIME_WAIT by a connection of its own. For about a minute
   the next chooser sees it taken, while rank 0's TCPStore, which sets SO_REUSEADDR as gRPC's
   servers do, can still bind it.

Where the ephemeral range leaves no room below it (an administrator widened it to start at
LOWEST or lower), a port is taken from inside it, held in the same way: a connection or
`bind(0)` will not be given it, but a program that found it free before may still bind it.

Also `python -m jupyterlab_mlcluster.runtime.ports`: print one port (the Slurm batch script
chooses MASTER_PORT with it on rank 0's node)."""

from __future__ import annotations

import errno
import random
import socket

# Below this, the well-known ports of services a user may start at any time (Jupyter's 8888,
# TensorBoard's 6006, MLflow's 5000, ...).
LOWEST = 10000
# The ports torchrun (29400: the c10d rendezvous) and torch.distributed's and accelerate's
# examples (29500) use when none is given: a user's own launcher may bind them meanwhile.
AVOIDED = frozenset({29400, 29500})
TRIES = 64
RANGE_FILE = "/proc/sys/net/ipv4/ip_local_port_range"

_random = random.SystemRandom()


def ephemeral_range() -> tuple[int, int]:
    """The kernel's range for connections and `bind(0)` (Linux's default when unreadable)."""
    try:
        with open(RANGE_FILE) as f:
            low, high = (int(part) for part in f.read().split())
    except (OSError, ValueError):
        return 32768, 60999
    return low, high


def _held(port: int) -> bool:
    """Take `port` if no one has it, and leave it in TIME_WAIT; False when it is taken."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        try:
            # Every address, and no SO_REUSEADDR yet: refused if any socket has the port,
            # a TIME_WAIT that another job's choice left included.
            listener.bind(("", port))
        except OSError:
            return False
        # Copied into the connection accepted below, so its TIME_WAIT lets a listener that
        # sets SO_REUSEADDR (TCPStore) bind the port.
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.listen(1)
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            accepted, _ = listener.accept()
            # This side closes first, so it (on `port`, not the client's port) waits.
            accepted.close()
        return True
    finally:
        listener.close()


def reserve_port() -> int:
    """A port no other program on this machine will be given for about a minute; OSError
    (EADDRINUSE) when none could be had in TRIES attempts."""
    low, _high = ephemeral_range()
    candidates = range(LOWEST, low)
    if len(candidates) == 0:
        candidates = range(low, _high + 1)
    for port in _random.sample(candidates, min(TRIES, len(candidates))):
        if port not in AVOIDED and _held(port):
            return port
    raise OSError(
        errno.EADDRINUSE,
        f"no free port for the job's ranks among {candidates.start}-{candidates.stop - 1}"
        f" ({TRIES} tried)",
    )


if __name__ == "__main__":
    print(reserve_port())
