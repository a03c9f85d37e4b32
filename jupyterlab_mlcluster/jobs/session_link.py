"""The session supervisor's connection to one rank (runtime/session_channel.py): a pod's
(backends/kubernetes/session.py) or a Slurm task's (backends/slurm/session.py).

The rank says which port it listens on in a signed record (a pod's log, a task's report
file); the pod's IP is in its status, the task's host in its record. The link connects
there, and both sides prove they hold the job's key (session_channel.py's handshake)
before any command goes out. Connecting and the
handshake (up to CONNECT_TIMEOUT + HANDSHAKE_TIMEOUT against a pod that does not answer),
then writing the commands (a cell's payload is megabytes, and a pod that stopped reading
takes none: up to SEND_TIMEOUT), run on a thread of the link's own (`_Wire`): the
supervisor's loop only looks whether it is connected and queues what it sends, so one
unreachable rank never holds up the others' output, a cancel or a cell's end. A
connection that fails or drops is tried again with the one backoff (jitter, a cap); the
session gives up on a rank that stays unreachable for `give_up_after` seconds
(`MLClusterConfig.kubernetes_session_channel_timeout`; session.py ends it, saying so).
Commands are lines signed with the connection's key (session_channel.connection_key: the
job's key over both handshake nonces) and carry a sequence number; a command sent again
after a reconnect keeps its old number, signed for the new connection: the link keeps the
commands of the current cell (`forget` drops them once it is over) and sends them all
again on a new connection, so a rank that had one refuses it as a replay and one that had
not runs it: each command runs once, none is lost with a dropped connection.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import secrets
import socket
import threading
import time
from typing import Any

from ..runtime.protocol import decode_record, encode_record
from ..runtime.session_channel import HANDSHAKE_TIMEOUT, HELLO, MAX_HELLO, connection_key
from .backoff import Backoff, backoff_from_env

log = logging.getLogger("jupyterlab_mlcluster.supervisor")

CONNECT_TIMEOUT = 5.0
SEND_TIMEOUT = 60.0  # one cell's payload to one rank
BACKOFF = Backoff(first=backoff_from_env().first, cap=5.0)


class LinkError(Exception):
    pass


class _Wire:
    """One connection to the rank, on a thread of its own: made (connect, the handshake),
    then writing what `send` queued, so that the supervisor's loop waits on no rank: not
    on a dial to a pod that does not answer, nor on a send to one that stopped reading
    (a cell's payload is megabytes). `ready` is set once connected or failed; `error`
    says why it failed or stopped writing. Only this thread closes the socket (the loop
    may be reading it: check_closed), once `close` was called."""

    def __init__(self, link: RankLink, host: str, port: int, now: float):
        self.started = now
        self.ready = threading.Event()
        self.sock: socket.socket | None = None
        self.key: bytes | None = None  # the connection's (session_channel.connection_key)
        self.error: BaseException | None = None
        self.outbox: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        self.thread = threading.Thread(
            target=self._run,
            args=(link.rank, link.key, host, port),
            name=f"session-link-{link.rank}",
            daemon=True,
        )

    def _run(self, rank: int, key: bytes, host: str, port: int) -> None:
        try:
            sock, conn_key = connect(rank, key, host, port)
        except Exception as exc:  # noqa: BLE001 - every failure is the link's to retry
            self.error = exc
            self.ready.set()
            return
        self.sock, self.key = sock, conn_key
        self.ready.set()
        try:
            while (data := self.outbox.get()) is not None:
                if self.error is None:
                    try:
                        sock.sendall(data)
                    except OSError as exc:
                        self.error = exc  # the loop sees it; what follows is dropped
        finally:
            with contextlib.suppress(OSError):
                sock.close()

    def send(self, data: bytes) -> None:
        self.outbox.put(data)

    def close(self) -> None:
        """Nobody wants this connection any more: what was queued is written, then it is
        closed (a dial still going is closed when it ends)."""
        self.outbox.put(None)


def connect(rank: int, key: bytes, host: str, port: int) -> tuple[socket.socket, bytes]:
    """A connection to the rank that proved the job's key, and its key (blocking)."""
    sock = socket.create_connection((host, port), timeout=CONNECT_TIMEOUT)
    try:
        deadline = time.monotonic() + HANDSHAKE_TIMEOUT  # the whole handshake, by the clock
        reader = sock.makefile("rb")

        def line(limit: int) -> bytes:
            sock.settimeout(max(0.001, deadline - time.monotonic()))
            return reader.readline(limit).rstrip(b"\n")

        greeting = line(256)
        if not greeting.startswith(HELLO):
            raise LinkError("the pod's port answered without the session's greeting")
        rank_nonce, nonce = greeting[len(HELLO) :].decode(errors="replace"), secrets.token_hex(16)
        hello = {"type": "hello", "rank_nonce": rank_nonce, "nonce": nonce}
        sock.sendall(encode_record(hello, key, rank))
        reply = decode_record(line(MAX_HELLO), key, rank)
        if not reply or reply.get("type") != "hello_ok" or reply.get("nonce") != nonce:
            raise LinkError("the pod's port did not prove the session's key")
        sock.settimeout(SEND_TIMEOUT)
        return sock, connection_key(key, rank_nonce, nonce)
    except BaseException:
        sock.close()
        raise


class RankLink:
    def __init__(self, rank: int, key: bytes, give_up_after: float):
        self.rank, self.key, self.give_up_after = rank, key, give_up_after
        self.host: str | None = None
        self.port: int | None = None
        self.wire: _Wire | None = None  # the connection, made or being made
        self.sock: socket.socket | None = None  # the wire's, once made
        self.conn_key: bytes | None = None  # what this connection's commands are signed with
        self.failures = 0
        self.retry_at = 0.0
        self.down_since: float | None = None  # since when a known address fails
        self.last_error: str | None = None
        self.window: list[dict[str, Any]] = []  # the current cell's commands: sent again

    @property
    def up(self) -> bool:
        return self.sock is not None and self.wire is not None and self.wire.error is None

    def address(self, host: str | None, port: int | None) -> None:
        if (host, port) != (self.host, self.port):
            self.host, self.port = host, port
            self.close()
            self.retry_at = 0.0

    def fileno(self) -> int:
        assert self.sock is not None
        return self.sock.fileno()

    def close(self) -> None:
        if self.wire is not None:
            self.wire.close()
        self.wire, self.sock, self.conn_key = None, None, None

    def gave_up(self, now: float) -> bool:
        return self.down_since is not None and now - self.down_since > self.give_up_after

    def ensure(self, now: float) -> bool:
        """Connected; False while not (a connection is made meanwhile, when due: this
        never waits for it)."""
        wire = self.wire
        if wire is not None:
            if not wire.ready.is_set():
                return False
            if wire.error is not None:
                # Down since the dial began, or now for a connection that stopped writing.
                since = wire.started if self.sock is None else None
                self._failed(now, wire.error, since=since)
                return False
            if self.sock is None:  # just made: what the cell sent so far goes again
                self.sock, self.conn_key = wire.sock, wire.key
                self.failures, self.down_since, self.last_error = 0, None, None
                for command in self.window:
                    wire.send(self._encode(command))
            return True
        if self.host is None or self.port is None or now < self.retry_at:
            return False
        wire = _Wire(self, self.host, self.port, now)
        try:
            wire.thread.start()
        except RuntimeError as exc:  # no thread to be had: as a failed connection
            self._failed(now, exc)
            return False
        self.wire = wire
        return False

    def forget(self) -> None:
        """The cell is over: its commands need no resending."""
        self.window = []

    def _failed(self, now: float, exc: BaseException, since: float | None = None) -> None:
        """Down since `since` (when the failed try began; else now), tried again later."""
        self.close()
        self.failures += 1
        self.last_error = str(exc) or type(exc).__name__
        if self.down_since is None:
            self.down_since = now if since is None else since
        self.retry_at = now + BACKOFF.delay(self.failures)
        log.debug("session link to rank %d: %s", self.rank, self.last_error)

    def _encode(self, command: dict[str, Any]) -> bytes:
        assert self.conn_key is not None
        return encode_record(command, self.conn_key, self.rank)

    def send(self, command: dict[str, Any]) -> bool:
        """Queue a signed command for the rank (sent again after a reconnect, and first
        then if the link is down); never waits for the rank."""
        self.window.append(command)
        if not self.up:
            return False
        assert self.wire is not None
        self.wire.send(self._encode(command))
        return True

    def check_closed(self) -> None:
        """The rank never writes after the handshake: readable means closed (or garbage).
        Called for a link select() found readable: this recv does not wait (and leaves the
        socket as the writing thread has it)."""
        if self.sock is None:
            return
        try:
            data = self.sock.recv(4096, socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._failed(time.monotonic(), exc)
            return
        if not data:
            self._failed(time.monotonic(), LinkError("the rank closed the connection"))
