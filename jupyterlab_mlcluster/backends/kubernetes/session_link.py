"""The session supervisor's connection to one rank's pod (runtime/session_channel.py).

The rank says which port it listens on in a signed record of its pod log; the pod's IP is
in its status. The link connects there, and both sides prove they hold the job's key
(session_channel.py's handshake) before any command goes out. A connection that fails or
drops is tried again with kubeconn's backoff (jitter, a cap); the session gives up on a
rank that stays unreachable for `give_up_after` seconds
(`MLClusterConfig.kubernetes_session_channel_timeout`; session.py ends it, saying so).
Commands are lines signed by the sender with the job's key and a sequence number; a line
sent again after a reconnect carries its old number: the link keeps the lines of the
current cell (`forget` drops them once it is over) and sends them all again on a new
connection, so a rank that had one refuses it as a replay and one that had not runs it:
each command runs once, none is lost with a dropped connection.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import socket
import time
from typing import Any

from ... import kubeconn
from ...runtime.protocol import decode_record, encode_record
from ...runtime.session_channel import HANDSHAKE_TIMEOUT, HELLO

log = logging.getLogger("jupyterlab_mlcluster.supervisor")

CONNECT_TIMEOUT = 5.0
SEND_TIMEOUT = 60.0  # one cell's payload to one rank
BACKOFF = kubeconn.Backoff(first=kubeconn.backoff_from_env().first, cap=5.0)


class LinkError(Exception):
    pass


class RankLink:
    def __init__(self, rank: int, key: bytes, give_up_after: float):
        self.rank, self.key, self.give_up_after = rank, key, give_up_after
        self.host: str | None = None
        self.port: int | None = None
        self.sock: socket.socket | None = None
        self.failures = 0
        self.retry_at = 0.0
        self.down_since: float | None = None  # since when a known address fails
        self.last_error: str | None = None
        self.window: list[bytes] = []  # the current cell's lines: sent again on reconnect

    @property
    def up(self) -> bool:
        return self.sock is not None

    def address(self, host: str | None, port: int | None) -> None:
        if (host, port) != (self.host, self.port):
            self.host, self.port = host, port
            self.close()
            self.retry_at = 0.0

    def fileno(self) -> int:
        assert self.sock is not None
        return self.sock.fileno()

    def close(self) -> None:
        if self.sock is not None:
            with contextlib.suppress(OSError):
                self.sock.close()
            self.sock = None

    def gave_up(self, now: float) -> bool:
        return self.down_since is not None and now - self.down_since > self.give_up_after

    def ensure(self, now: float) -> bool:
        """Connected (trying now when due); False while not."""
        if self.sock is not None:
            return True
        if self.host is None or self.port is None or now < self.retry_at:
            return False
        try:
            self.sock = self._connect()
        except (OSError, LinkError) as exc:
            self._failed(now, exc)
            return False
        self.failures, self.down_since, self.last_error = 0, None, None
        try:
            for line in self.window:
                self.sock.sendall(line)
        except OSError as exc:
            self._failed(now, exc)
        return self.sock is not None

    def forget(self) -> None:
        """The cell is over: its lines need no resending."""
        self.window = []

    def _failed(self, now: float, exc: BaseException) -> None:
        self.close()
        self.failures += 1
        self.last_error = str(exc) or type(exc).__name__
        if self.down_since is None:
            self.down_since = now
        self.retry_at = now + BACKOFF.delay(self.failures)
        log.debug("session link to rank %d: %s", self.rank, self.last_error)

    def _connect(self) -> socket.socket:
        assert self.host is not None and self.port is not None
        sock = socket.create_connection((self.host, self.port), timeout=CONNECT_TIMEOUT)
        try:
            sock.settimeout(HANDSHAKE_TIMEOUT)
            reader = sock.makefile("rb")
            line = reader.readline(256).rstrip(b"\n")
            if not line.startswith(HELLO):
                raise LinkError("the pod's port answered without the session's greeting")
            nonce = secrets.token_hex(16)
            hello = {"type": "hello", "rank_nonce": line[len(HELLO) :].decode(), "nonce": nonce}
            sock.sendall(encode_record(hello, self.key, self.rank))
            reply = decode_record(reader.readline(65536).rstrip(b"\n"), self.key, self.rank)
            if not reply or reply.get("type") != "hello_ok" or reply.get("nonce") != nonce:
                raise LinkError("the pod's port did not prove the session's key")
            sock.settimeout(SEND_TIMEOUT)
            return sock
        except BaseException:
            sock.close()
            raise

    def send(self, command: dict[str, Any]) -> bool:
        """Send a signed command (sent later, after a reconnect, if the link is down)."""
        return self.send_line(encode_record(command, self.key, self.rank))

    def send_line(self, line: bytes) -> bool:
        self.window.append(line)
        if self.sock is None:
            return False
        try:
            self.sock.sendall(line)
            return True
        except OSError as exc:
            self._failed(time.monotonic(), exc)
            return False

    def check_closed(self) -> None:
        """The rank never writes after the handshake: readable means closed (or garbage)."""
        if self.sock is None:
            return
        try:
            self.sock.setblocking(False)
            data = self.sock.recv(4096)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._failed(time.monotonic(), exc)
            return
        finally:
            if self.sock is not None:
                self.sock.settimeout(SEND_TIMEOUT)
        if not data:
            self._failed(time.monotonic(), LinkError("the rank closed the connection"))
