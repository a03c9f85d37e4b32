"""A pod's rank dumps its own stacks when its supervisor asks (runtime/stackdump.py's helper,
for where nobody can read the rank from outside: a pod has no SYS_PTRACE, and Kubernetes has
no way to signal a container).

The rank listens on a TCP port (`MLCLUSTER_STACKS_PORT`, any free one by default; "off": no
helper) and says which in a signed record on its pod log; whoever holds the job's key (the
job's supervisor, or the server or CLI of its owner: backends/kubernetes/stacks.py) dials the
pod's IP there. One exchange per connection, each bound to fresh nonces of both sides:

    rank  -> asker   HELLO <rank nonce>
    asker -> rank    signed {"type": "stacks_ask", "rank_nonce": ..., "nonce": <n>, "ack": b}
    rank  -> asker   signed {"type": "stacks_dump", "nonce": <n>, "main": ..., "text": ...}
                     (or {"type": "stacks_acked", "nonce": <n>} for an ack)

The dump is faulthandler's, taken by this thread: it needs the GIL only between two of the
main thread's bytecodes (a rank blocked in a collective or I/O has let it go; one spinning in
Python code lets it go every switch interval). An ask that does not prove the key gets
nothing; one thread serves connections one at a time, each within ASK_TIMEOUT by the clock,
reading at most MAX_ASK bytes, so a stranger on the pod network costs at most a late answer,
never the rank's work. The dump sent is cut at MAX_DUMP bytes (the asker bounds what it
reads too).

An `ack` touches the file `hold_for_peers` (stackdump.py) waits for: a failing rank in a pod
holds its sockets open until its supervisor has read the peers waiting for it, then is let go.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import secrets
import socket
import tempfile
import threading
import time
from typing import Any

from . import reporting
from .protocol import decode_record, encode_record, key_path, read_key_file

PORT_ENV = "MLCLUSTER_STACKS_PORT"
HELLO = b"MLCLUSTER-STACKS "
ASK_TIMEOUT = 2.0  # one connection's whole exchange, by the clock
MAX_ASK = 1024  # a signed ask is about 250 bytes
MAX_DUMP = 512 * 1024  # faulthandler writes at most 100 frames of 100 threads


def listen(ack_env: str) -> bool:
    """Start the helper where the job's key is here (a pod's rank: stackdump.arm); False
    where it is not started. `ack_env`: the variable naming the file an ack touches
    (stackdump's, set here when the launcher did not)."""
    setting = os.environ.get(PORT_ENV, "0") or "0"
    payload = os.environ.get("MLCLUSTER_PAYLOAD")
    key = read_key_file(key_path(payload)) if payload else None
    if setting == "off" or not setting.isdigit() or key is None:
        return False
    rank = int(os.environ.get("RANK", "0") or 0)
    try:
        dual = socket.has_dualstack_ipv6()
        server = socket.create_server(
            ("", int(setting)),
            family=socket.AF_INET6 if dual else socket.AF_INET,
            dualstack_ipv6=dual,
        )
    except OSError:
        return False
    if not os.environ.get(ack_env):
        ack = f"mlcluster-{os.getpid()}-{secrets.token_hex(8)}.ack"
        os.environ[ack_env] = os.path.join(tempfile.gettempdir(), ack)
    helper = _Helper(server, key, rank, threading.main_thread().ident, os.environ[ack_env])
    threading.Thread(target=helper.serve, name="mlcluster-stacks", daemon=True).start()
    return reporting.send({"type": "stacks_port", "port": server.getsockname()[1]})


class _Helper:
    def __init__(
        self, server: socket.socket, key: bytes, rank: int, main: int | None, ack: str = ""
    ):
        self.server, self.key, self.rank, self.main, self.ack = server, key, rank, main, ack

    def serve(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                time.sleep(0.05)  # (out of descriptors: the next ask may find one)
                continue
            with conn, contextlib.suppress(OSError, ValueError):
                self._one(conn, time.monotonic() + ASK_TIMEOUT)

    def _one(self, conn: socket.socket, deadline: float) -> None:
        nonce = secrets.token_hex(16)
        conn.settimeout(ASK_TIMEOUT)
        conn.sendall(HELLO + nonce.encode() + b"\n")
        data = b""
        while b"\n" not in data:
            left = deadline - time.monotonic()
            if left <= 0 or len(data) > MAX_ASK:
                return
            conn.settimeout(left)
            chunk = conn.recv(MAX_ASK)
            if not chunk:
                return
            data += chunk
        ask = decode_record(data.split(b"\n", 1)[0], self.key, self.rank)
        if not ask or ask.get("type") != "stacks_ask" or ask.get("rank_nonce") != nonce:
            return
        theirs = str(ask.get("nonce") or "")[:64]
        if ask.get("ack"):
            _touch(self.ack)
            answer: dict[str, Any] = {"type": "stacks_acked", "nonce": theirs}
        else:
            text = dump()
            answer = {
                "type": "stacks_dump",
                "nonce": theirs,
                "main": self.main,
                "helper": threading.get_ident(),
                "text": text[:MAX_DUMP],
                "cut": len(text) > MAX_DUMP,
            }
        conn.settimeout(max(0.1, deadline - time.monotonic()) + ASK_TIMEOUT)
        conn.sendall(encode_record(answer, self.key, self.rank))


def dump() -> str:
    """Every thread's stack, as faulthandler writes it."""
    with tempfile.TemporaryFile() as f:
        faulthandler.dump_traceback(file=f, all_threads=True)
        f.seek(0)
        return f.read(MAX_DUMP + 1).decode("utf-8", "replace")


def _touch(path: str) -> None:
    if path:
        flags = os.O_WRONLY | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0)
        with contextlib.suppress(OSError):
            os.close(os.open(path, flags, 0o600))
