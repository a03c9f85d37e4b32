"""A session's rank in a Kubernetes pod: where its cells come from (runtime/session_worker.py).

A local session rank reads its commands from a pipe only its supervisor holds. A pod has no
such pipe: here the rank listens on a TCP port (`MLCLUSTER_SESSION_PORT`, any free one by
default), says which in a signed record on stdout (its pod log, which the session's
supervisor reads: backends/kubernetes/session.py) and the supervisor connects to the pod's
IP on it. Nobody else may drive the rank, so a connection counts only after a handshake
in which both sides prove they hold the job's key (the one in the payload Secret, never in
the environment), bound to fresh nonces of both:

    rank -> supervisor   HELLO <rank nonce>
    supervisor -> rank   signed {"type": "hello", "rank_nonce": <rank nonce>, "nonce": <n>}
    rank -> supervisor   signed {"type": "hello_ok", "nonce": <n>}

Then the supervisor sends signed command lines (session_worker.py: key, this rank's number,
a sequence number that only goes up, so a line recorded on the wire is refused when
replayed). A connection that fails the handshake, or stays silent, is closed; several may
try at once (a stranger's cannot hold the port), and the newest authenticated one is the
channel (the supervisor reconnects after a drop; the sequence numbers carry on).

A rank without its supervisor for `MLCLUSTER_SESSION_ORPHAN_TIMEOUT` seconds (none connected
since it started, or since the last connection dropped: the supervisor died and nobody
deleted the pods) ends as a stopped session's rank does (atexit runs, exit 0), so that its
pod frees its node's GPUs and CPUs instead of idling forever; a live supervisor reconnects
long before (it gives up on a rank sooner: MLClusterConfig.kubernetes_session_channel_timeout).

`interrupt` commands are acted on here, at once, while the rank's main thread runs a cell:
SIGINT to itself (KeyboardInterrupt in the cell's code, as the local supervisor's signal).
Integrity and authenticity, not secrecy: see SECURITY.md (a cell's code crosses the pod
network as the payload Secrets' data does the API server's).
"""

from __future__ import annotations

import contextlib
import os
import queue
import secrets
import socket
import sys
import threading
import time
from collections.abc import Callable

from . import reporting
from .protocol import decode_record, encode_record

HELLO = b"MLCLUSTER-SESSION-HELLO "
HANDSHAKE_TIMEOUT = 10.0
MAX_COMMAND = 256 * 1024 * 1024  # one cell's code and pushed variables, base64


class CommandChannel:
    """`readline()` gives the next command line from the supervisor (blocking)."""

    def __init__(self, key: bytes, rank: int, on_interrupt: Callable[[str | None], None]):
        self.key, self.rank, self.on_interrupt = key, rank, on_interrupt
        self.lines: queue.Queue[bytes] = queue.Queue()
        self.lock = threading.Lock()
        self.current: socket.socket | None = None
        self.seen_seq = 0  # the highest sequence number of an authentic command
        self.alone_since: float | None = time.monotonic()  # no supervisor connected since
        self.orphan_timeout = float(os.environ.get("MLCLUSTER_SESSION_ORPHAN_TIMEOUT", "0") or 0)
        port = int(os.environ.get("MLCLUSTER_SESSION_PORT", "0") or 0)
        # Both IPv4 and IPv6 where the pod has both (a pod IP may be either).
        dual = socket.has_dualstack_ipv6()
        self.server = socket.create_server(
            ("", port), family=socket.AF_INET6 if dual else socket.AF_INET, dualstack_ipv6=dual
        )
        self.port = self.server.getsockname()[1]
        threading.Thread(target=self._accept, name="session-channel", daemon=True).start()
        if self.orphan_timeout > 0:
            threading.Thread(target=self._watch, name="session-orphan", daemon=True).start()
        reporting.send({"type": "session_channel", "port": self.port})

    def readline(self) -> bytes:
        """The next line; b"" (the end) once the rank was left without its supervisor."""
        return self.lines.get()

    def _watch(self) -> None:
        while True:
            time.sleep(min(1.0, self.orphan_timeout / 4))
            with self.lock:
                since = self.alone_since
            if since is not None and time.monotonic() - since > self.orphan_timeout:
                print(
                    f"mlcluster session: rank {self.rank} heard from no supervisor for"
                    f" {self.orphan_timeout:g} s: ending",
                    file=sys.stderr,
                    flush=True,
                )
                self.lines.put(b"")
                return

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _handshake(self, conn: socket.socket, reader) -> bool:
        nonce = secrets.token_hex(16)
        conn.sendall(HELLO + nonce.encode() + b"\n")
        hello = decode_record(reader.readline(65536).rstrip(b"\n"), self.key, self.rank)
        if not hello or hello.get("type") != "hello" or hello.get("rank_nonce") != nonce:
            return False
        theirs = hello.get("nonce")
        if not isinstance(theirs, str) or not theirs:
            return False
        conn.sendall(encode_record({"type": "hello_ok", "nonce": theirs}, self.key, self.rank))
        return True

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(HANDSHAKE_TIMEOUT)
            reader = conn.makefile("rb")
            try:
                if not self._handshake(conn, reader):
                    _refused(self.rank, "a connection that did not prove the session's key")
                    return
            except OSError:
                return
            conn.settimeout(None)
            with self.lock:
                old, self.current = self.current, conn
                self.alone_since = None
            if old is not None:
                with contextlib.suppress(OSError):
                    old.shutdown(socket.SHUT_RDWR)  # the supervisor reconnected: one channel
            try:
                while True:
                    raw = reader.readline(MAX_COMMAND)
                    if not raw:
                        return
                    self._command(raw)
            except OSError:
                return
            finally:
                with self.lock:
                    if self.current is conn:
                        self.current, self.alone_since = None, time.monotonic()

    def _command(self, raw: bytes) -> None:
        record = decode_record(raw.rstrip(b"\n"), self.key, self.rank)
        seq = record.get("seq") if record else None
        if record is None or not isinstance(seq, int):
            self.lines.put(raw)  # session_worker says it was refused, as for a local rank
            return
        with self.lock:
            fresh = seq > self.seen_seq
            self.seen_seq = max(self.seen_seq, seq)
        if record.get("type") == "interrupt":
            if fresh:
                job = record.get("job")
                self.on_interrupt(job if isinstance(job, str) else None)
            else:
                _refused(self.rank, "a replayed interrupt")
            return
        self.lines.put(raw)


def _refused(rank: int, what: str) -> None:
    print(f"mlcluster session: rank {rank} refused {what}", file=sys.stderr, flush=True)
